// Command image builds informerd's OCI image from the Go build alone, with
// no container daemon: `make image` runs it.
//
// For each platform it builds /informerd and /informerctl as static
// binaries (CGO_ENABLED=0, -trimpath, the version stamped into
// internal/version) and puts them in a single layer FROM scratch, with an
// /etc/passwd and /etc/group that name the numeric non-root user the image
// runs as. There is nothing else: no shell, no package manager, no libc.
// The images go into one image index (a multi-arch index when -platforms
// names several), written as an OCI image layout whose index.json has that
// index as its only entry, named by -version:
//
//	crane push _output/image registry.example/informerd:VERSION
//	skopeo copy --all oci:_output/image:VERSION docker://registry.example/informerd:VERSION
//
// The output is reproducible: file times and the image's creation time are
// SOURCE_DATE_EPOCH (the Unix epoch when unset), so the same sources give
// the same digests.
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const (
	// user is the image's user, as uid:gid: distroless's "nonroot".
	user    = "65532:65532"
	passwd  = "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin\n"
	group   = "root:x:0:\nnonroot:x:65532:\n"
	module  = "github.com/informerd/informerd"
	verVar  = module + "/internal/version.Version"
	refName = "org.opencontainers.image.ref.name"
)

// binaries are the commands the image holds, at its root; the first is the
// entrypoint.
var binaries = []string{"informerd", "informerctl"}

// options is the parsed command line.
type options struct {
	root, out, goCmd          string
	version, source, revision string
	platforms                 []v1.Platform
	created                   time.Time
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(2)
	}
	if err := build(o); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	fs.StringVar(&o.root, "root", "../..", "informerd's module directory (the clone's root)")
	fs.StringVar(&o.out, "out", "", "OCI image layout directory to write; an existing layout there is replaced")
	fs.StringVar(&o.goCmd, "go", "go", "the go command that builds the binaries")
	fs.StringVar(&o.version, "version", "", "the version: stamped into the binaries, the org.opencontainers.image.version label and the layout's ref name")
	fs.StringVar(&o.source, "source", "https://"+module, "the org.opencontainers.image.source label")
	fs.StringVar(&o.revision, "revision", "", "the org.opencontainers.image.revision label (a commit); empty: none")
	platforms := fs.String("platforms", "linux/amd64", "comma-separated os/arch platforms, e.g. linux/amd64,linux/arm64")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q: image takes flags only", fs.Args())
	}
	if o.out == "" {
		return nil, errors.New("-out is empty: name the layout directory to write")
	}
	if o.version == "" || strings.ContainsAny(o.version, " \t\n'\"") {
		return nil, fmt.Errorf("-version %q: want a non-empty version without spaces or quotes, e.g. v0.1.0", o.version)
	}
	for p := range strings.SplitSeq(*platforms, ",") {
		goos, goarch, ok := strings.Cut(strings.TrimSpace(p), "/")
		if !ok || goos == "" || goarch == "" || strings.Contains(goarch, "/") {
			return nil, fmt.Errorf("-platforms: %q is not os/arch (variants are not supported), e.g. linux/arm64", p)
		}
		o.platforms = append(o.platforms, v1.Platform{OS: goos, Architecture: goarch})
	}
	o.created = time.Unix(0, 0).UTC()
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("SOURCE_DATE_EPOCH %q: want seconds since the Unix epoch", s)
		}
		o.created = time.Unix(sec, 0).UTC()
	}
	return o, nil
}

// build writes the image layout o describes.
func build(o *options) error {
	if err := clearLayout(o.out); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "informerd-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	labels := map[string]string{
		"org.opencontainers.image.title":       "informerd",
		"org.opencontainers.image.description": "Node-local shared-informer daemon for Kubernetes",
		"org.opencontainers.image.version":     o.version,
		"org.opencontainers.image.source":      o.source,
		"org.opencontainers.image.created":     o.created.Format(time.RFC3339),
	}
	if o.revision != "" {
		labels["org.opencontainers.image.revision"] = o.revision
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range o.platforms {
		dir := filepath.Join(tmp, p.OS+"_"+p.Architecture)
		if err := goBuild(o, p, dir); err != nil {
			return err
		}
		img, err := platformImage(o, p, dir, labels)
		if err != nil {
			return fmt.Errorf("%s/%s: %w", p.OS, p.Architecture, err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &p}})
	}
	idx = mutate.Annotations(idx, labels).(v1.ImageIndex)

	lp, err := layout.Write(o.out, empty.Index)
	if err != nil {
		return err
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{refName: o.version})); err != nil {
		return err
	}
	return report(o, idx)
}

// clearLayout removes the OCI layout at dir, if there is one, so that blobs
// of earlier builds do not pile up; it refuses to remove anything else.
func clearLayout(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) || (err == nil && len(entries) == 0) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("-out %s: %w", dir, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "oci-layout")); err != nil {
		return fmt.Errorf("-out %s: exists and is not an OCI image layout (no oci-layout file); remove it or choose another directory", dir)
	}
	return os.RemoveAll(dir)
}

// goBuild builds the binaries for platform p into dir.
func goBuild(o *options, p v1.Platform, dir string) error {
	args := []string{"build", "-trimpath", "-ldflags", "-s -w -X " + verVar + "=" + o.version, "-o", dir + string(filepath.Separator)}
	for _, b := range binaries {
		args = append(args, "./cmd/"+b)
	}
	cmd := exec.Command(o.goCmd, args...)
	cmd.Dir = o.root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.OS, "GOARCH="+p.Architecture)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build for %s/%s in %s: %w", p.OS, p.Architecture, o.root, err)
	}
	return nil
}

// platformImage is the image of the binaries in dir for platform p.
func platformImage(o *options, p v1.Platform, dir string, labels map[string]string) (v1.Image, error) {
	layerTar, err := rootfs(dir, o.created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{Layer: layer, History: v1.History{
		Created:   v1.Time{Time: o.created},
		CreatedBy: "hack/image: /informerd /informerctl /etc/passwd /etc/group",
	}})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = p.OS, p.Architecture
	cf.Created = v1.Time{Time: o.created}
	cf.Config = v1.Config{
		Entrypoint: []string{"/" + binaries[0]},
		User:       user,
		WorkingDir: "/",
		Labels:     labels,
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, err
	}
	return mutate.Annotations(img, labels).(v1.Image), nil
}

// rootfs is the image's only layer, an uncompressed tar: the binaries in
// dir, executable and owned by root so that the user cannot change them,
// and the user and group files.
func rootfs(dir string, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(name string, mode int64, data []byte) error {
		h := &tar.Header{Name: name, Mode: mode, ModTime: mtime, Uname: "root", Gname: "root", Format: tar.FormatPAX}
		if strings.HasSuffix(name, "/") {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	if err := add("etc/", 0o755, nil); err != nil {
		return nil, err
	}
	if err := add("etc/group", 0o644, []byte(group)); err != nil {
		return nil, err
	}
	if err := add("etc/passwd", 0o644, []byte(passwd)); err != nil {
		return nil, err
	}
	for _, b := range binaries {
		data, err := os.ReadFile(filepath.Join(dir, b))
		if err != nil {
			return nil, err
		}
		if err := add(b, 0o755, data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// report prints what was written: the index's digest, then each platform's
// manifest digest and compressed size.
func report(o *options, idx v1.ImageIndex) error {
	digest, err := idx.Digest()
	if err != nil {
		return err
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return err
	}
	fmt.Printf("%s: informerd %s, index %s\n", o.out, o.version, digest)
	for _, d := range m.Manifests {
		img, err := idx.Image(d.Digest)
		if err != nil {
			return err
		}
		im, err := img.Manifest()
		if err != nil {
			return err
		}
		size := im.Config.Size
		for _, l := range im.Layers {
			size += l.Size
		}
		fmt.Printf("  %s/%s %s, %.1f MiB compressed\n", d.Platform.OS, d.Platform.Architecture, d.Digest, float64(size)/(1<<20))
	}
	return nil
}
