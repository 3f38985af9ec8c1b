package handoff

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
)

// SendFile sends f's descriptor over c (SCM_RIGHTS) with the one byte
// tag, which the receiver gets with it. f stays open in the sender.
func SendFile(c *net.UnixConn, f *os.File, tag byte) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var werr error
	if err := rc.Control(func(fd uintptr) {
		_, _, werr = c.WriteMsgUnix([]byte{tag}, syscall.UnixRights(int(fd)), nil)
	}); err != nil {
		return err
	}
	return werr
}

// RecvFile receives one descriptor sent by SendFile, and its tag. A
// message with no descriptor, or more than one, is an error (any received
// is closed).
func RecvFile(c *net.UnixConn, name string) (*os.File, byte, error) {
	var tag [1]byte
	oob := make([]byte, syscall.CmsgSpace(4*4)) // room to see, and close, a few too many
	n, oobn, flags, _, err := c.ReadMsgUnix(tag[:], oob)
	if err != nil {
		return nil, 0, err
	}
	var fds []int
	if msgs, err := syscall.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for i := range msgs {
			if got, err := syscall.ParseUnixRights(&msgs[i]); err == nil {
				fds = append(fds, got...)
			}
		}
	}
	switch {
	case n != 1 || len(fds) != 1 || flags&syscall.MSG_CTRUNC != 0:
		for _, fd := range fds {
			_ = syscall.Close(fd)
		}
		if n == 0 {
			return nil, 0, errors.New("the old daemon closed the handoff before sending its listener")
		}
		return nil, 0, fmt.Errorf("a handoff message with %d descriptors, want 1", len(fds))
	}
	return os.NewFile(uintptr(fds[0]), name), tag[0], nil
}
