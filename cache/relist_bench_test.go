package cache

import (
	"fmt"
	"strconv"
	"testing"
	"time"
)

// BenchmarkRelist measures publishing the difference of a relist of
// 100,000 objects, 1% of them changed, under the Source's lock.
func BenchmarkRelist(b *testing.B) {
	const n, changed = 100000, 1000
	lists := [2][]*Object{}
	for v := range lists {
		for i := range n {
			rv := strconv.Itoa(i + 1)
			if i%(n/changed) == 0 {
				rv = strconv.Itoa(n + v*n + i + 1)
			}
			name := fmt.Sprintf("o-%06d", i)
			lists[v] = append(lists[v], &Object{Namespace: "ns", Name: name, ResourceVersion: rv,
				Data: fmt.Appendf(nil, `{"metadata":{"name":%q,"namespace":"ns","uid":"u-%d","resourceVersion":%q}}`, name, i, rv)})
		}
	}
	s := newSource(Key{}, nil, testSourceConfig(LogLimits{MinAge: -1}, time.Hour))
	s.publishList(lists[0], strconv.Itoa(3*n))
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		s.publishList(lists[(i+1)%2], strconv.Itoa(3*n+i+1))
	}
}
