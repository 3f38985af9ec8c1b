package cache

import (
	"bytes"
	"errors"
	"hash/maphash"
	"math"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// This file shares metadata.managedFields between objects. They are a
// third of a Pod, and they repeat: the objects of a kind are written by
// the same managers, which own the same fields. What differs between two
// objects is small: each entry's time, and the keys of the lists that name
// an address (the kubelet's `k:{"ip":"10.0.0.7"}` under podIPs). These are
// the holes; what lies between them is the shape, shared by every object
// that has it.
//
// An object whose managedFields are shared keeps in Data its managedFields
// cut down to the holes, as entries of their own (a time as an entry's
// time, an address key as the one key of an entry's fieldsV1), so that
// Data stays a valid object of its kind for readers that do not read
// managedFields; Object.Buffers puts the shape back around the holes.
//
// The managedFields are, in JSON, the value of the first managedFields
// member of the first metadata member; in protobuf, the first run of
// managedFields fields (17) of the ObjectMeta (field 1) of the first raw
// message (field 2) of the runtime.Unknown. Cutting them down changes
// nothing else, so the same rule finds them again in Data.

// mfShape is the managedFields of objects of a kind around their holes.
// It is immutable and shared.
type mfShape struct {
	pieces [][]byte // one more than the holes; sub-slices of one buffer
	size   int      // the pieces' bytes
}

// maxShapeBytes is the largest shape shared: a larger one is unusual, and
// its object keeps its managedFields whole.
const maxShapeBytes = 64 << 10

// maxShapesBytes bounds the bytes of each generation of shapes an interner
// holds, as maxInterned bounds their number.
const maxShapesBytes = 8 << 20

// hole is a byte range of managedFields that an object keeps.
type hole struct {
	span
	time bool // an entry's time; else an address key
}

// share cuts o's managedFields down to their holes and makes o share their
// shape through in, if they have any and o does not share them yet. o must
// not be published yet.
func (in *interner) share(o *Object) {
	if in == nil || o.mf != nil {
		return
	}
	proto := IsProtobuf(o.Data)
	var region span
	var ok bool
	if proto {
		region, ok = protoManagedFields(o.Data)
	} else {
		region, ok = jsonManagedFields(o.Data)
	}
	if !ok {
		return
	}
	mf := o.Data[region.from:region.to]
	var holes []hole
	var compact []byte
	if proto {
		holes = protoHoles(mf)
		compact = protoCompact(mf, holes)
	} else {
		holes = jsonHoles(mf)
		compact = jsonCompact(mf, holes)
	}
	shape := newShape(mf, holes)
	if shape.size > maxShapeBytes {
		return
	}
	var data []byte
	if proto {
		bufs, ok := protoSplice(o.Data, region, len(compact), [][]byte{compact})
		if !ok {
			return
		}
		data = bytes.Join(bufs, nil)
	} else {
		data = make([]byte, 0, len(o.Data)-len(mf)+len(compact))
		data = append(append(append(data, o.Data[:region.from]...), compact...), o.Data[region.to:]...)
	}
	// The holes must come back as they went: the object is served from
	// them. Anything unexpected keeps the object whole.
	at, got, ok := holesIn(data)
	if !ok || len(got) != len(holes) || uint64(len(data)) > math.MaxUint32 {
		return
	}
	for i, h := range holes {
		if !bytes.Equal(got[i], mf[h.from:h.to]) {
			return
		}
	}
	o.Data, o.mf, o.mfAt, o.mfEnd = data, in.shape(shape), uint32(at.from), uint32(at.to)
}

// locateManaged records where o's cut-down managedFields are in its Data,
// after Data changed around them; false if they are not found.
func (o *Object) locateManaged() bool {
	at, holes, ok := holesIn(o.Data)
	if !ok || len(holes)+1 != len(o.mf.pieces) {
		return false
	}
	o.mfAt, o.mfEnd = uint32(at.from), uint32(at.to)
	return true
}

// newShape returns the shape of mf around holes, its pieces sub-slices
// of mf until the interner makes them its own (see shape).
func newShape(mf []byte, holes []hole) *mfShape {
	s := &mfShape{pieces: make([][]byte, 0, len(holes)+1)}
	at := 0
	for _, h := range append(holes, hole{span: span{len(mf), len(mf)}}) {
		s.pieces = append(s.pieces, mf[at:h.from:h.from])
		s.size += h.from - at
		at = h.to
	}
	return s
}

// minSharedPiece is the smallest piece of a shape shared on its own: the
// shapes of one kind that differ in a few bytes (the lengths, in
// protobuf, of entries that hold an IP of another length) share the rest.
const minSharedPiece = 64

// shape returns the shared copy of the new shape s, equal to it. The
// pieces of a shape it keeps are its own: shared with other shapes, or
// copied.
func (in *interner) shape(s *mfShape) *mfShape {
	key := in.hash(s.pieces...)
	in.mu.Lock()
	defer in.mu.Unlock()
	if v, ok := in.shapes[key]; ok {
		if v.equal(s) {
			return v
		}
		return in.own(s) // a collision: not shared
	}
	if v, ok := in.prevShapes[key]; ok && v.equal(s) {
		s = v
	} else {
		s = in.own(s)
	}
	if len(in.shapes) >= maxInterned || in.shapesBytes+s.size > maxShapesBytes {
		in.prevShapes, in.shapes, in.shapesBytes = in.shapes, make(map[uint64]*mfShape, len(in.shapes)), 0
	}
	in.shapes[key] = s
	in.shapesBytes += s.size
	return s
}

// hash returns the hash of a sequence of pieces.
func (in *interner) hash(pieces ...[]byte) uint64 {
	var h maphash.Hash
	h.SetSeed(in.seed)
	var n [binaryLen]byte
	for _, p := range pieces {
		h.Write(putLen(n[:], len(p)))
		h.Write(p)
	}
	return h.Sum64()
}

// own makes s's pieces the interner's: each large piece shared with the
// shapes that have it, the small ones copied into one buffer. in.mu must
// be held.
func (in *interner) own(s *mfShape) *mfShape {
	small := 0
	for i, p := range s.pieces {
		if len(p) < minSharedPiece {
			small += len(p)
			continue
		}
		key := in.hash(p)
		v, ok := in.pieces[key]
		if !ok || !bytes.Equal(v, p) {
			if w, ok := in.prevPieces[key]; ok && bytes.Equal(w, p) {
				v = w
			} else {
				v = bytes.Clone(p)
			}
			if len(in.pieces) >= maxInterned || in.piecesBytes+len(v) > maxShapesBytes {
				in.prevPieces, in.pieces, in.piecesBytes = in.pieces, make(map[uint64][]byte, len(in.pieces)), 0
			}
			if _, taken := in.pieces[key]; !taken {
				in.pieces[key] = v
				in.piecesBytes += len(v)
			}
		}
		s.pieces[i] = v
	}
	buf := make([]byte, 0, small)
	for i, p := range s.pieces {
		if len(p) < minSharedPiece {
			start := len(buf)
			buf = append(buf, p...)
			s.pieces[i] = buf[start:len(buf):len(buf)]
		}
	}
	return s
}

const binaryLen = 8

func putLen(b []byte, n int) []byte {
	for i := range b {
		b[i] = byte(n >> (8 * i))
	}
	return b
}

func (s *mfShape) equal(t *mfShape) bool {
	if len(s.pieces) != len(t.pieces) || s.size != t.size {
		return false
	}
	for i := range s.pieces {
		if !bytes.Equal(s.pieces[i], t.pieces[i]) {
			return false
		}
	}
	return true
}

// Buffers returns o as the API server sent it (see Data), as buffers to
// write back to back: Data itself, or pieces of Data around the shared
// bytes of its managedFields. Nothing is copied; the buffers must not be
// modified.
func (o *Object) Buffers() [][]byte {
	if o.mf == nil {
		return [][]byte{o.Data}
	}
	region := span{int(o.mfAt), int(o.mfEnd)}
	holesOf := jsonHolesIn
	if IsProtobuf(o.Data) {
		holesOf = protoHolesIn
	}
	holes, ok := holesOf(o.Data[region.from:region.to])
	if !ok || len(holes)+1 != len(o.mf.pieces) {
		return [][]byte{o.Data} // cannot happen: share checked it
	}
	repl := make([][]byte, 0, 2*len(holes)+1)
	for i, p := range o.mf.pieces {
		if len(p) > 0 {
			repl = append(repl, p)
		}
		if i < len(holes) {
			repl = append(repl, holes[i])
		}
	}
	size := o.mf.size
	for _, h := range holes {
		size += len(h)
	}
	if IsProtobuf(o.Data) {
		bufs, ok := protoSplice(o.Data, region, size, repl)
		if !ok {
			return [][]byte{o.Data}
		}
		return bufs
	}
	return append(append([][]byte{o.Data[:region.from]}, repl...), o.Data[region.to:])
}

// Bytes returns o as the API server sent it (see Data): Data itself, or a
// new slice if its managedFields are shared.
func (o *Object) Bytes() []byte {
	if o.mf == nil {
		return o.Data
	}
	return bytes.Join(o.Buffers(), nil)
}

// holesIn returns where data's cut-down managedFields are and the holes
// they keep.
func holesIn(data []byte) (span, [][]byte, bool) {
	locate, holesOf := jsonManagedFields, jsonHolesIn
	if IsProtobuf(data) {
		locate, holesOf = protoManagedFields, protoHolesIn
	}
	region, ok := locate(data)
	if !ok {
		return span{}, nil, false
	}
	holes, ok := holesOf(data[region.from:region.to])
	return region, holes, ok
}

// errFound ends a scan once what it looks for is found.
var errFound = errors.New("found")

// jsonManagedFields returns the span of the value of the first
// managedFields member of the first metadata member of the JSON object b,
// if it is an array.
func jsonManagedFields(b []byte) (span, bool) {
	s := &scanner{b: b}
	var at span
	inMeta := false
	err := s.fields(func() error {
		k, err := s.member("metadata")
		if err != nil || k != 0 || inMeta {
			if err == nil {
				err = s.skip()
			}
			return err
		}
		inMeta = true
		if isNull, err := s.null(); isNull || err != nil {
			return err
		}
		return s.fields(func() error {
			k, err := s.member("managedFields")
			if err != nil {
				return err
			}
			s.ws()
			from := s.i
			if err := s.skip(); err != nil || k != 0 {
				return err
			}
			at = span{from, s.i}
			return errFound
		})
	})
	return at, errors.Is(err, errFound) && b[at.from] == '['
}

var (
	jsonTimeMember = []byte(`"time":"`)
	jsonIPKey      = []byte(`"k:{\"ip\":`)
)

// jsonHoles returns the holes of the JSON managedFields mf, in order: the
// string values of time members that are times, and the keys naming an ip.
// Outside of strings a quote starts or ends one, so the patterns match
// only whole tokens.
func jsonHoles(mf []byte) []hole {
	var holes []hole
	for at := 0; at < len(mf); {
		t := indexFrom(mf, at, jsonTimeMember)
		k := indexFrom(mf, at, jsonIPKey)
		switch {
		case t < 0 && k < 0:
			return holes
		case t >= 0 && (k < 0 || t < k):
			from := t + len(jsonTimeMember) - 1
			end := bytes.IndexByte(mf[from+1:], '"')
			if end < 0 {
				return holes
			}
			to := from + 1 + end + 1
			v := mf[from+1 : to-1]
			if bytes.IndexByte(v, '\\') < 0 && isTime(v) {
				holes = append(holes, hole{span{from, to}, true})
			}
			at = to
		default:
			s := &scanner{b: mf, i: k}
			if _, _, err := s.str(); err != nil {
				return holes
			}
			if s.peek() == ':' {
				holes = append(holes, hole{span: span{k, s.i}})
			}
			at = s.i
		}
	}
	return holes
}

func isTime(v []byte) bool {
	_, err := time.Parse(time.RFC3339, string(v))
	return err == nil
}

func indexFrom(b []byte, at int, sep []byte) int {
	i := bytes.Index(b[at:], sep)
	if i < 0 {
		return -1
	}
	return at + i
}

// jsonCompact returns the managedFields that keep only the holes of mf:
// an entry {"time":T} per time, {"fieldsV1":{K:{}}} per key.
func jsonCompact(mf []byte, holes []hole) []byte {
	b := []byte{'['}
	for i, h := range holes {
		if i > 0 {
			b = append(b, ',')
		}
		if h.time {
			b = append(append(append(b, `{"time":`...), mf[h.from:h.to]...), '}')
		} else {
			b = append(append(append(b, `{"fieldsV1":{`...), mf[h.from:h.to]...), `:{}}}`...)
		}
	}
	return append(b, ']')
}

// jsonHolesIn returns the holes that jsonCompact kept, in order.
func jsonHolesIn(c []byte) ([][]byte, bool) {
	var holes [][]byte
	s := &scanner{b: c}
	if err := s.expect('['); err != nil {
		return nil, false
	}
	if s.peek() == ']' {
		return nil, true
	}
	for {
		err := s.fields(func() error {
			k, err := s.member("time", "fieldsV1")
			if err != nil || k < 0 {
				if err == nil {
					err = s.skip()
				}
				return err
			}
			if k == 0 {
				s.ws()
				from := s.i
				if _, _, err := s.str(); err != nil {
					return err
				}
				holes = append(holes, c[from:s.i])
				return nil
			}
			return s.fields(func() error {
				s.ws()
				from := s.i
				if _, _, err := s.str(); err != nil {
					return err
				}
				holes = append(holes, c[from:s.i])
				if err := s.expect(':'); err != nil {
					return err
				}
				return s.skip()
			})
		})
		if err != nil {
			return nil, false
		}
		switch s.peek() {
		case ',':
			s.i++
		case ']':
			return holes, true
		default:
			return nil, false
		}
	}
}

// protoManagedFields returns the span, in the encoded object data, of the
// first run of managedFields fields (17) of its ObjectMeta.
func protoManagedFields(data []byte) (span, bool) {
	var at span
	ok := protoPath(data, func(meta []byte, metaAt int) bool {
		var run span
		found, done := false, false
		_ = protoFields(meta, func(fd protoField) error {
			switch {
			case done:
			case fd.num == 17 && fd.typ == protowire.BytesType:
				if !found {
					run.from = fd.start
				}
				run.to, found = fd.end, true
			case found:
				done = true
			}
			return nil
		})
		at = span{metaAt + run.from, metaAt + run.to}
		return found
	})
	return at, ok
}

// protoPath calls f with the ObjectMeta of the encoded object data (the
// first field 1 of the first field 2 of its runtime.Unknown) and its
// offset in data, and returns what f returns, or false if there is none.
func protoPath(data []byte, f func(meta []byte, at int) bool) bool {
	if !IsProtobuf(data) {
		return false
	}
	found := false
	first := func(msg []byte, num protowire.Number, f func(v []byte, at int) bool) bool {
		err := protoFields(msg, func(fd protoField) error {
			if fd.num != num || fd.typ != protowire.BytesType {
				return nil
			}
			found = f(fd.value, fd.end-len(fd.value))
			return errFound
		})
		return errors.Is(err, errFound) && found
	}
	u := data[len(protoMagic):]
	return first(u, 2, func(raw []byte, rawAt int) bool {
		return first(raw, 1, func(meta []byte, metaAt int) bool {
			return f(meta, len(protoMagic)+rawAt+metaAt)
		})
	})
}

// protoHoles returns the holes of a run of managedFields fields: each
// entry's time (field 4, whole), and the keys naming an ip in the JSON of
// its fieldsV1 (field 7, whose raw is field 1).
func protoHoles(run []byte) []hole {
	var holes []hole
	_ = protoFields(run, func(e protoField) error {
		eAt := e.end - len(e.value)
		return protoFields(e.value, func(fd protoField) error {
			switch {
			case fd.num == 4 && fd.typ == protowire.BytesType:
				holes = append(holes, hole{span{eAt + fd.start, eAt + fd.end}, true})
			case fd.num == 7 && fd.typ == protowire.BytesType:
				vAt := eAt + fd.end - len(fd.value)
				_ = protoFields(fd.value, func(r protoField) error {
					if r.num == 1 && r.typ == protowire.BytesType {
						rAt := vAt + r.end - len(r.value)
						for _, h := range jsonHoles(r.value) {
							if !h.time {
								holes = append(holes, hole{span: span{rAt + h.from, rAt + h.to}})
							}
						}
					}
					return nil
				})
			}
			return nil
		})
	})
	return holes
}

// protoCompact returns the managedFields fields that keep only the holes
// of run: an entry holding the time field per time, an entry whose
// fieldsV1 is {K:{}} per key; with no holes, one empty entry, so that the
// run stays where it was.
func protoCompact(run []byte, holes []hole) []byte {
	var b []byte
	for _, h := range holes {
		v := run[h.from:h.to]
		var e []byte
		if h.time {
			e = v
		} else {
			raw := append(append([]byte{'{'}, v...), `:{}}`...)
			var f []byte
			f = protowire.AppendTag(f, 1, protowire.BytesType)
			f = protowire.AppendBytes(f, raw)
			e = protowire.AppendTag(e, 7, protowire.BytesType)
			e = protowire.AppendBytes(e, f)
		}
		b = protowire.AppendTag(b, 17, protowire.BytesType)
		b = protowire.AppendBytes(b, e)
	}
	if len(holes) == 0 {
		b = protowire.AppendTag(b, 17, protowire.BytesType)
		b = protowire.AppendBytes(b, nil)
	}
	return b
}

// protoHolesIn returns the holes that protoCompact kept, in order.
func protoHolesIn(run []byte) ([][]byte, bool) {
	var holes [][]byte
	err := protoFields(run, func(e protoField) error {
		return protoFields(e.value, func(fd protoField) error {
			switch {
			case fd.num == 4:
				holes = append(holes, e.value[fd.start:fd.end])
			case fd.num == 7:
				return protoFields(fd.value, func(r protoField) error {
					if r.num == 1 {
						v := r.value
						if len(v) < 5 || v[0] != '{' || !bytes.HasSuffix(v, []byte(`:{}}`)) {
							return errBadProto
						}
						holes = append(holes, v[1:len(v)-4])
					}
					return nil
				})
			}
			return nil
		})
	})
	return holes, err == nil
}

// protoSplice returns the encoded object data with its bytes in region
// (within its ObjectMeta) replaced by repl, of size bytes in all, as
// buffers: the lengths of the ObjectMeta and of the raw message that
// holds it are written anew, everything else is data's.
func protoSplice(data []byte, region span, size int, repl [][]byte) ([][]byte, bool) {
	delta := size - (region.to - region.from)
	var bufs [][]byte
	ok := false
	u := data[len(protoMagic):]
	_ = protoFields(u, func(raw protoField) error {
		if raw.num != 2 || raw.typ != protowire.BytesType {
			return nil
		}
		rawAt := len(protoMagic) + raw.end - len(raw.value)
		_ = protoFields(raw.value, func(meta protoField) error {
			if meta.num != 1 || meta.typ != protowire.BytesType {
				return nil
			}
			metaAt := rawAt + meta.end - len(meta.value)
			if region.from < metaAt || region.to > metaAt+len(meta.value) {
				return errFound // not in this ObjectMeta: cannot happen
			}
			metaLen := len(meta.value) + delta
			rawLen := len(raw.value) + delta +
				protowire.SizeVarint(uint64(metaLen)) - protowire.SizeVarint(uint64(len(meta.value)))
			var prefixes []byte
			prefixes = protowire.AppendTag(prefixes, 2, protowire.BytesType)
			prefixes = protowire.AppendVarint(prefixes, uint64(rawLen))
			n := len(prefixes)
			prefixes = protowire.AppendTag(prefixes, 1, protowire.BytesType)
			prefixes = protowire.AppendVarint(prefixes, uint64(metaLen))
			bufs = append(bufs,
				data[:len(protoMagic)+raw.start], prefixes[:n],
				data[rawAt:rawAt+meta.start], prefixes[n:],
				data[metaAt:region.from])
			bufs = append(bufs, repl...)
			bufs = append(bufs, data[region.to:])
			ok = true
			return errFound
		})
		return errFound // the first raw message only, as protoPath
	})
	return bufs, ok
}
