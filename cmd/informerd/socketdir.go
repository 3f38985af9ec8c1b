package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// owner is a uid and gid.
type owner struct{ uid, gid int }

// parseOwner reads "UID:GID", both numbers.
func parseOwner(s string) (owner, error) {
	u, g, ok := strings.Cut(s, ":")
	uid, err1 := strconv.ParseUint(u, 10, 31)
	gid, err2 := strconv.ParseUint(g, 10, 31)
	if !ok || err1 != nil || err2 != nil {
		return owner{}, errors.New("want UID:GID, two numbers, for example 65532:65532")
	}
	return owner{int(uid), int(gid)}, nil
}

// prepareSocketDir makes dir a directory owned by o with mode, so that a
// daemon running as o, with no capability, can create its socket there
// (and remove a stale one): 0755 for -socket's, which any client can
// reach, 0700 for -handoff-socket's, which only the daemon's user can. The
// kubelet creates a hostPath directory root-owned: this runs as root, once,
// with CAP_CHOWN only. It changes the mode first, while root owns dir,
// and refuses to follow a symbolic link or to touch anything but a
// directory.
func prepareSocketDir(dir string, o owner, mode os.FileMode) error {
	if err := os.MkdirAll(dir, mode); err != nil {
		return err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory (%s)", dir, fi.Mode().Type())
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) == o.uid && int(st.Gid) == o.gid && fi.Mode().Perm() == mode {
		return nil
	}
	if err := os.Chmod(dir, mode); err != nil {
		return err
	}
	return os.Lchown(dir, o.uid, o.gid)
}
