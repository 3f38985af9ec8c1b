package auth

import (
	"net"
	"syscall"
)

// unixCred reads the credentials the kernel recorded for the peer of c
// when it connected.
func unixCred(c *net.UnixConn) (uid, gid uint32, pid int32, ok bool) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, 0, 0, false
	}
	var cred *syscall.Ucred
	cerr := raw.Control(func(fd uintptr) {
		cred, err = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	})
	if cerr != nil || err != nil {
		return 0, 0, 0, false
	}
	return cred.Uid, cred.Gid, cred.Pid, true
}
