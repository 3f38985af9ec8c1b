// Package handoff is the wire format of a hot handoff: what a running
// informerd daemon hands to its replacement on the same node, so that the
// replacement serves the same informers without listing them again (see
// docs/operations.md, "Upgrade by handoff").
//
// A handoff is one stream, written by the old daemon and read whole by the
// new one before it installs anything:
//
//	magic "informerd-handoff\n", version (uint32, big endian)
//	records: kind (1 byte), length (uvarint), payload
//	  's': a Source (JSON), followed by its Count objects
//	  'o': one object, its bytes as the API server sent them
//	  'x': a named extra (name length (uvarint), name, bytes): state
//	       other than informers, such as what the daemon has cached of
//	       the API server's discovery and access reviews; at most one of
//	       a name, between Sources
//	  'e': the end (JSON: sources, objects and extras written), then the CRC-32C
//	       (Castagnoli) of every byte before it (uint32, big endian)
//
// Read checks everything: the magic and version (a handoff of another
// version is refused, never guessed at), every length against its limit,
// the records' order and counts, and the checksum; any failure is an error
// and nothing of the handoff is returned, so a reader never installs a
// partial state.
package handoff

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
)

// Version is the format written. Read accepts it and version 1 (the same
// without extras); daemons of versions that write another hand off
// nothing, and the new one starts cold.
const Version = 2

const magic = "informerd-handoff\n"

// Record kinds.
const (
	recSource = 's'
	recObject = 'o'
	recExtra  = 'x'
	recEnd    = 'e'
)

// maxMetaBytes bounds a Source or end record.
const maxMetaBytes = 64 << 10

// maxNameBytes bounds an extra's name.
const maxNameBytes = 256

// Source is one informer handed off: its identity, its type, the position
// its objects are at, and how many objects follow it.
type Source struct {
	Group         string `json:"group,omitempty"`
	Version       string `json:"version"`
	Resource      string `json:"resource"`
	Namespace     string `json:"namespace,omitempty"`
	FieldSelector string `json:"fieldSelector,omitempty"`
	Protobuf      bool   `json:"protobuf,omitempty"`
	// APIVersion and Kind are the objects' type.
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// ResourceVersion is the informer's position: its objects are the
	// API server's state at it, and its watch resumes from it.
	ResourceVersion string `json:"resourceVersion"`
	Count           int    `json:"count"`
}

type end struct {
	Sources int `json:"sources"`
	Objects int `json:"objects"`
	Extras  int `json:"extras,omitempty"`
}

// Writer writes a handoff. Its methods are not safe for concurrent use.
type Writer struct {
	w       *bufio.Writer
	crc     hash.Hash32
	sources int
	objects int
	extras  int
	err     error
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// NewWriter writes the header to w and returns a Writer of the records.
func NewWriter(w io.Writer) *Writer {
	hw := &Writer{crc: crc32.New(castagnoli)}
	hw.w = bufio.NewWriterSize(io.MultiWriter(w, hw.crc), 64<<10)
	var v [4]byte
	binary.BigEndian.PutUint32(v[:], Version)
	hw.write([]byte(magic), v[:])
	return hw
}

func (w *Writer) write(bufs ...[]byte) {
	for _, b := range bufs {
		if w.err != nil {
			return
		}
		_, w.err = w.w.Write(b)
	}
}

func (w *Writer) record(kind byte, size int, bufs ...[]byte) {
	var hdr [1 + binary.MaxVarintLen64]byte
	hdr[0] = kind
	n := binary.PutUvarint(hdr[1:], uint64(size))
	w.write(append([][]byte{hdr[:1+n]}, bufs...)...)
}

// WriteSource writes s, whose Count objects must follow, each by Object.
func (w *Writer) WriteSource(s Source) error {
	meta, err := json.Marshal(s)
	if err != nil {
		return err
	}
	w.record(recSource, len(meta), meta)
	w.sources++
	return w.err
}

// Object writes one object, given as the buffers that make it up back to
// back (cache.Object.Buffers: nothing is copied).
func (w *Writer) Object(bufs [][]byte) error {
	size := 0
	for _, b := range bufs {
		size += len(b)
	}
	w.record(recObject, size, bufs...)
	w.objects++
	return w.err
}

// Extra writes data as the extra called name (at most one of a name; not
// between a Source and its objects).
func (w *Writer) Extra(name string, data []byte) error {
	if name == "" || len(name) > maxNameBytes {
		return fmt.Errorf("an extra's name must have 1 to %d bytes, not %d", maxNameBytes, len(name))
	}
	var n [binary.MaxVarintLen64]byte
	hdr := binary.PutUvarint(n[:], uint64(len(name)))
	w.record(recExtra, hdr+len(name)+len(data), n[:hdr], []byte(name), data)
	w.extras++
	return w.err
}

// Close writes the end record and the checksum, and flushes. It does not
// close the underlying writer.
func (w *Writer) Close() error {
	meta, _ := json.Marshal(end{Sources: w.sources, Objects: w.objects, Extras: w.extras})
	w.record(recEnd, len(meta), meta)
	if w.err == nil {
		w.err = w.w.Flush()
	}
	if w.err != nil {
		return w.err
	}
	// The checksum covers everything flushed before it.
	var sum [4]byte
	binary.BigEndian.PutUint32(sum[:], w.crc.Sum32())
	w.write(sum[:])
	if w.err == nil {
		w.err = w.w.Flush()
	}
	return w.err
}

// Handed is one Source read, with its objects.
type Handed struct {
	Source
	Objects [][]byte
}

// Contents is a handoff read whole.
type Contents struct {
	Sources []Handed
	// Extras are the extras by name (nil: none).
	Extras map[string][]byte
}

// Limits bound what Read accepts.
type Limits struct {
	// MaxObjectBytes bounds one object (0: 64 MiB).
	MaxObjectBytes int
	// MaxExtraBytes bounds one extra (0: 64 MiB).
	MaxExtraBytes int
	// MaxBytes bounds the whole handoff (0: no bound).
	MaxBytes int64
}

// ErrVersion: the handoff is of another version.
var ErrVersion = errors.New("handoff of another version")

// Read reads a whole handoff from r, checking it (see the package
// comment). It returns nothing but an error if anything is wrong.
func Read(r io.Reader, lim Limits) (*Contents, error) {
	if lim.MaxObjectBytes <= 0 {
		lim.MaxObjectBytes = 64 << 20
	}
	if lim.MaxExtraBytes <= 0 {
		lim.MaxExtraBytes = 64 << 20
	}
	cr := &crcReader{r: bufio.NewReaderSize(r, 64<<10), crc: crc32.New(castagnoli)}
	head, err := cr.next(len(magic) + 4)
	if err != nil {
		return nil, fmt.Errorf("reading the handoff's header: %w", err)
	}
	if string(head[:len(magic)]) != magic {
		return nil, errors.New("not a handoff: its header is wrong")
	}
	if v := binary.BigEndian.Uint32(head[len(magic):]); v != 1 && v != Version {
		return nil, fmt.Errorf("%w: version %d, this daemon reads versions 1 to %d", ErrVersion, v, Version)
	}
	var (
		out     []Handed
		extras  map[string][]byte
		objects int
	)
	for {
		kind, err := cr.ReadByte()
		if err != nil {
			return nil, fmt.Errorf("reading the handoff: %w", err)
		}
		size, err := binary.ReadUvarint(cr)
		if err != nil {
			return nil, fmt.Errorf("reading the handoff: %w", unexpected(err))
		}
		limit := uint64(maxMetaBytes)
		switch kind {
		case recObject:
			limit = uint64(lim.MaxObjectBytes)
		case recExtra:
			limit = uint64(lim.MaxExtraBytes) + maxNameBytes + binary.MaxVarintLen64
		}
		if size > limit {
			return nil, fmt.Errorf("a handoff record of %d bytes, over the limit of %d", size, limit)
		}
		if lim.MaxBytes > 0 && cr.n+int64(size) > lim.MaxBytes {
			return nil, fmt.Errorf("the handoff is over its limit of %d bytes", lim.MaxBytes)
		}
		payload, err := cr.next(int(size))
		if err != nil {
			return nil, fmt.Errorf("reading the handoff: %w", err)
		}
		var cur *Handed
		if len(out) > 0 {
			cur = &out[len(out)-1]
		}
		if kind != recObject && cur != nil && len(cur.Objects) != cur.Count {
			return nil, fmt.Errorf("the handoff's %s has %d objects of %d", cur.Resource, len(cur.Objects), cur.Count)
		}
		switch kind {
		case recSource:
			var s Source
			if err := json.Unmarshal(payload, &s); err != nil {
				return nil, fmt.Errorf("a handoff Source: %w", err)
			}
			if s.Count < 0 || s.Version == "" || s.Resource == "" || s.ResourceVersion == "" {
				return nil, fmt.Errorf("a handoff Source without a resource or a position, or with %d objects", s.Count)
			}
			out = append(out, Handed{Source: s, Objects: make([][]byte, 0, min(s.Count, 1<<16))})
		case recObject:
			if cur == nil || len(cur.Objects) == cur.Count {
				return nil, errors.New("a handoff object outside any Source")
			}
			cur.Objects = append(cur.Objects, payload)
			objects++
		case recExtra:
			n, k := binary.Uvarint(payload)
			if k <= 0 || n == 0 || n > maxNameBytes || n > uint64(len(payload)-k) {
				return nil, errors.New("a handoff extra without a valid name")
			}
			name, data := string(payload[k:k+int(n)]), payload[k+int(n):]
			if len(data) > lim.MaxExtraBytes {
				return nil, fmt.Errorf("the handoff's extra %q has %d bytes, over the limit of %d", name, len(data), lim.MaxExtraBytes)
			}
			if _, dup := extras[name]; dup {
				return nil, fmt.Errorf("the handoff has two extras %q", name)
			}
			if extras == nil {
				extras = map[string][]byte{}
			}
			extras[name] = data
		case recEnd:
			var e end
			if err := json.Unmarshal(payload, &e); err != nil {
				return nil, fmt.Errorf("the handoff's end: %w", err)
			}
			if e.Sources != len(out) || e.Objects != objects || e.Extras != len(extras) {
				return nil, fmt.Errorf("the handoff ends saying %d Sources, %d objects and %d extras; it held %d, %d and %d", e.Sources, e.Objects, e.Extras, len(out), objects, len(extras))
			}
			want := cr.crc.Sum32()
			sum, err := cr.next(4)
			if err != nil {
				return nil, fmt.Errorf("reading the handoff's checksum: %w", err)
			}
			if got := binary.BigEndian.Uint32(sum); got != want {
				return nil, fmt.Errorf("the handoff is corrupt: its checksum is %08x, its bytes sum to %08x", got, want)
			}
			return &Contents{Sources: out, Extras: extras}, nil
		default:
			return nil, fmt.Errorf("a handoff record of unknown kind %q", kind)
		}
	}
}

// crcReader reads a handoff, summing and counting what it consumes.
type crcReader struct {
	r   *bufio.Reader
	crc hash.Hash32
	n   int64
}

func (c *crcReader) ReadByte() (byte, error) {
	b, err := c.r.ReadByte()
	if err != nil {
		return 0, unexpected(err)
	}
	c.crc.Write([]byte{b})
	c.n++
	return b, nil
}

// next returns the next n bytes, in a slice of their own.
func (c *crcReader) next(n int) ([]byte, error) {
	b := make([]byte, n)
	if _, err := io.ReadFull(c.r, b); err != nil {
		return nil, unexpected(err)
	}
	c.crc.Write(b)
	c.n += int64(n)
	return b, nil
}

// unexpected turns the clean end of a stream in the middle of a handoff
// into io.ErrUnexpectedEOF.
func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}
