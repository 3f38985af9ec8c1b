// Package image tests `make image`: it builds the image into a temporary
// OCI image layout and opens it with the standard library alone (index.json,
// the image index, the manifest, the config, the layer), so that
// go-containerregistry stays out of informerd's go.mod.
package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// OCI media types (image-spec v1.1).
const (
	mediaIndex    = "application/vnd.oci.image.index.v1+json"
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaConfig   = "application/vnd.oci.image.config.v1+json"
	mediaLayer    = "application/vnd.oci.image.layer.v1.tar+gzip"
	labelVersion  = "org.opencontainers.image.version"
)

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations"`
	Platform    *struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
	} `json:"platform"`
}

type index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []descriptor `json:"manifests"`
}

type manifest struct {
	SchemaVersion int               `json:"schemaVersion"`
	MediaType     string            `json:"mediaType"`
	Config        descriptor        `json:"config"`
	Layers        []descriptor      `json:"layers"`
	Annotations   map[string]string `json:"annotations"`
}

type imageConfig struct {
	OS           string `json:"os"`
	Architecture string `json:"architecture"`
	Config       struct {
		User       string            `json:"User"`
		Entrypoint []string          `json:"Entrypoint"`
		Cmd        []string          `json:"Cmd"`
		Env        []string          `json:"Env"`
		Labels     map[string]string `json:"Labels"`
	} `json:"config"`
	RootFS struct {
		Type    string   `json:"type"`
		DiffIDs []string `json:"diff_ids"`
	} `json:"rootfs"`
}

// file is one regular file or directory of the image's filesystem.
type file struct {
	hdr  *tar.Header
	data []byte
}

// TestMakeImage builds the image for this machine's architecture with
// `make image` and checks what an operator relies on: the layout is valid
// (every blob matches its digest), the entrypoint is /informerd, the user
// is numeric and not root, the filesystem holds exactly the two static
// binaries and the user files (so no shell, no package manager, no libc),
// and the version label is the version the binary prints.
func TestMakeImage(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	const version = "v0.0.0-imagetest.1"
	out := filepath.Join(t.TempDir(), "layout")
	platform := "linux/" + runtime.GOARCH
	cmd := exec.Command("make", "--no-print-directory", "-C", root, "image",
		"VERSION="+version, "PLATFORMS="+platform, "IMAGE_DIR="+out)
	// Not the outer make's flags and jobserver, when `make test` runs this.
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "MAKEFLAGS=") || strings.HasPrefix(kv, "MFLAGS=") || strings.HasPrefix(kv, "MAKELEVEL=")
	})
	start := time.Now()
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make image: %v\n%s", err, b)
	}
	t.Logf("make image took %s:\n%s", time.Since(start).Round(time.Second), b)

	if b := readFile(t, filepath.Join(out, "oci-layout")); !strings.Contains(string(b), `"imageLayoutVersion"`) {
		t.Fatalf("oci-layout = %s, want an imageLayoutVersion", b)
	}
	var top index
	decode(t, readFile(t, filepath.Join(out, "index.json")), &top)
	if len(top.Manifests) != 1 {
		t.Fatalf("index.json has %d entries, want 1 (crane push takes a layout with one entry)", len(top.Manifests))
	}
	entry := top.Manifests[0]
	if entry.MediaType != mediaIndex {
		t.Fatalf("index.json's entry is a %q, want an image index", entry.MediaType)
	}
	if got := entry.Annotations["org.opencontainers.image.ref.name"]; got != version {
		t.Errorf("ref name = %q, want %q (skopeo copy oci:DIR:%s)", got, version, version)
	}
	var idx index
	decode(t, blob(t, out, entry, mediaIndex), &idx)
	if len(idx.Manifests) != 1 || idx.Manifests[0].Platform == nil ||
		idx.Manifests[0].Platform.OS+"/"+idx.Manifests[0].Platform.Architecture != platform {
		t.Fatalf("image index = %+v, want one manifest for %s", idx.Manifests, platform)
	}
	var m manifest
	decode(t, blob(t, out, idx.Manifests[0], mediaManifest), &m)
	if m.SchemaVersion != 2 || m.MediaType != mediaManifest {
		t.Errorf("manifest schemaVersion %d, mediaType %q: want 2, %q", m.SchemaVersion, m.MediaType, mediaManifest)
	}
	if got := m.Annotations[labelVersion]; got != version {
		t.Errorf("manifest annotation %s = %q, want %q", labelVersion, got, version)
	}
	var cfg imageConfig
	decode(t, blob(t, out, m.Config, mediaConfig), &cfg)

	t.Run("config", func(t *testing.T) {
		if cfg.OS+"/"+cfg.Architecture != platform {
			t.Errorf("config platform %s/%s, want %s", cfg.OS, cfg.Architecture, platform)
		}
		if !slices.Equal(cfg.Config.Entrypoint, []string{"/informerd"}) || len(cfg.Config.Cmd) != 0 {
			t.Errorf("entrypoint %q, cmd %q: want [/informerd] and no cmd", cfg.Config.Entrypoint, cfg.Config.Cmd)
		}
		checkUser(t, cfg.Config.User)
		labels := cfg.Config.Labels
		if labels[labelVersion] != version {
			t.Errorf("label %s = %q, want %q", labelVersion, labels[labelVersion], version)
		}
		if got := labels["org.opencontainers.image.title"]; got != "informerd" {
			t.Errorf("title label = %q, want informerd", got)
		}
		if got := labels["org.opencontainers.image.source"]; !strings.HasPrefix(got, "https://") {
			t.Errorf("source label = %q, want a URL", got)
		}
	})

	files := layers(t, out, m, cfg)
	t.Run("filesystem", func(t *testing.T) {
		var names []string
		for name := range files {
			names = append(names, name)
		}
		slices.Sort(names)
		// Exactly this: no shell, no busybox, no package manager, no libc.
		want := []string{"etc", "etc/group", "etc/passwd", "informerctl", "informerd"}
		if !slices.Equal(names, want) {
			t.Errorf("image files = %q, want exactly %q", names, want)
		}
		for _, name := range names {
			if base := path.Base(name); slices.Contains([]string{"sh", "bash", "ash", "dash", "busybox", "apk", "apt", "dpkg"}, base) {
				t.Errorf("image holds %s", name)
			}
		}
		uid, _, _ := strings.Cut(cfg.Config.User, ":")
		if !strings.Contains(string(files["etc/passwd"].data), ":x:"+uid+":") {
			t.Errorf("/etc/passwd names no user %s:\n%s", uid, files["etc/passwd"].data)
		}
		for _, name := range []string{"informerd", "informerctl"} {
			h := files[name].hdr
			// Owned by root and not writable by the image's user.
			if h.Typeflag != tar.TypeReg || h.Mode&0o777 != 0o755 || h.Uid != 0 || h.Gid != 0 {
				t.Errorf("/%s: type %c, mode %o, owner %d:%d; want a regular file 0755 owned by 0:0", name, h.Typeflag, h.Mode, h.Uid, h.Gid)
			}
			checkStatic(t, name, files[name].data)
		}
	})

	t.Run("version", func(t *testing.T) {
		bin := filepath.Join(t.TempDir(), "informerd")
		if err := os.WriteFile(bin, files["informerd"].data, 0o755); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(bin, "-version").CombinedOutput()
		if err != nil {
			t.Fatalf("/informerd -version: %v\n%s", err, out)
		}
		if got := strings.TrimSpace(string(out)); got != version {
			t.Errorf("/informerd -version printed %q, want the label's %q", got, version)
		}
	})
}

// checkUser checks that user is uid:gid, both numeric (Kubernetes'
// runAsNonRoot can verify only a numeric user) and neither 0.
func checkUser(t *testing.T, user string) {
	t.Helper()
	uid, gid, ok := strings.Cut(user, ":")
	u, errU := strconv.Atoi(uid)
	g, errG := strconv.Atoi(gid)
	if !ok || errU != nil || errG != nil || u == 0 || g == 0 {
		t.Errorf("user %q: want numeric non-root uid:gid", user)
	}
}

// checkStatic checks that data is an ELF executable for this architecture
// with no program interpreter and no dynamic section: it needs no libc.
func checkStatic(t *testing.T, name string, data []byte) {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		t.Errorf("/%s: not ELF: %v", name, err)
		return
	}
	machine := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[runtime.GOARCH]
	if f.Type != elf.ET_EXEC || f.Machine != machine {
		t.Errorf("/%s: ELF type %v machine %v, want a static executable for %v", name, f.Type, f.Machine, machine)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("/%s has a %v program header: dynamically linked", name, p.Type)
		}
	}
	if f.Section(".dynamic") != nil || f.Section(".interp") != nil {
		t.Errorf("/%s has a dynamic section", name)
	}
}

// layers reads m's layers, checking each against its diff ID, and returns
// the filesystem they make.
func layers(t *testing.T, dir string, m manifest, cfg imageConfig) map[string]file {
	t.Helper()
	if cfg.RootFS.Type != "layers" || len(cfg.RootFS.DiffIDs) != len(m.Layers) {
		t.Fatalf("rootfs %s with %d diff IDs for %d layers", cfg.RootFS.Type, len(cfg.RootFS.DiffIDs), len(m.Layers))
	}
	files := map[string]file{}
	for i, l := range m.Layers {
		zr, err := gzip.NewReader(bytes.NewReader(blob(t, dir, l, mediaLayer)))
		if err != nil {
			t.Fatalf("layer %s: %v", l.Digest, err)
		}
		h := sha256.New()
		tr := tar.NewReader(io.TeeReader(zr, h))
		for {
			hdr, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("layer %s: %v", l.Digest, err)
			}
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatalf("layer %s: %s: %v", l.Digest, hdr.Name, err)
			}
			files[strings.Trim(path.Clean(hdr.Name), "/")] = file{hdr: hdr, data: data}
		}
		if _, err := io.Copy(h, zr); err != nil { // the tar's end padding
			t.Fatal(err)
		}
		if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != cfg.RootFS.DiffIDs[i] {
			t.Errorf("layer %s: uncompressed digest %s, config's diff ID %s", l.Digest, got, cfg.RootFS.DiffIDs[i])
		}
	}
	return files
}

// blob reads the blob d describes from the layout in dir, checking its
// media type, size and digest.
func blob(t *testing.T, dir string, d descriptor, mediaType string) []byte {
	t.Helper()
	if d.MediaType != mediaType {
		t.Fatalf("%s: media type %q, want %q", d.Digest, d.MediaType, mediaType)
	}
	alg, hexDigest, _ := strings.Cut(d.Digest, ":")
	if alg != "sha256" {
		t.Fatalf("digest %q: want sha256", d.Digest)
	}
	b := readFile(t, filepath.Join(dir, "blobs", alg, hexDigest))
	if sum := sha256.Sum256(b); int64(len(b)) != d.Size || hex.EncodeToString(sum[:]) != hexDigest {
		t.Fatalf("blob %s: %d bytes with digest sha256:%x, descriptor says %d bytes", d.Digest, len(b), sum, d.Size)
	}
	return b
}

func readFile(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func decode(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%T: %v\n%s", v, err, b)
	}
	if s, ok := v.(*index); ok && s.SchemaVersion != 2 {
		t.Fatalf("index schemaVersion %d, want 2", s.SchemaVersion)
	}
}
