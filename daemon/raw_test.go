package daemon

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// BenchmarkRawUnixBaseline is the ceiling BenchmarkFanOut is compared
// with: the same encoded event frames written to the same number of Unix
// socket connections, one writer goroutine per connection as the daemon
// has one per stream, with no gRPC, no cache and no upstream.
func BenchmarkRawUnixBaseline(b *testing.B) {
	for _, n := range []int{1, 10, 100, 1000} {
		for _, size := range []int{1024, 4096} {
			b.Run(fmt.Sprintf("subscribers=%d/object=%dB", n, size), func(b *testing.B) {
				frame := encodeFrame(&informerdv1.Event{
					Type:            informerdv1.EventType_EVENT_TYPE_MODIFIED,
					Object:          bytes.Repeat([]byte("x"), size),
					ResourceVersion: "1234567",
				})
				l, err := net.Listen("unix", filepath.Join(b.TempDir(), "raw.sock"))
				if err != nil {
					b.Fatal(err)
				}
				defer l.Close()
				servers := make([]net.Conn, n)
				var readers sync.WaitGroup
				want := int64(b.N) * int64(len(frame))
				for i := range n {
					c, err := net.Dial("unix", l.Addr().String())
					if err != nil {
						b.Fatal(err)
					}
					defer c.Close()
					if servers[i], err = l.Accept(); err != nil {
						b.Fatal(err)
					}
					defer servers[i].Close()
					readers.Add(1)
					go func() { // ends after want bytes
						defer readers.Done()
						if _, err := io.CopyN(io.Discard, c, want); err != nil {
							b.Error(err)
						}
					}()
				}
				b.ReportAllocs()
				b.ResetTimer()
				start := time.Now()
				var writers sync.WaitGroup
				for _, s := range servers {
					writers.Add(1)
					go func() { // ends after b.N frames
						defer writers.Done()
						for range b.N {
							if _, err := s.Write(frame); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				writers.Wait()
				readers.Wait()
				elapsed := time.Since(start)
				b.StopTimer()
				b.ReportMetric(float64(b.N*n)/elapsed.Seconds(), "deliveries/s")
			})
		}
	}
}
