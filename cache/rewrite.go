package cache

import (
	"encoding/json"

	"google.golang.org/protobuf/encoding/protowire"
)

// withResourceVersion returns a copy of o whose metadata.resourceVersion
// is rv, as the API server stamps the last state of a deleted object with
// the resourceVersion of its deletion. A client-go reflector takes its
// position from the objects it receives, so a deletion must never carry
// an older one. If o's bytes cannot be rewritten (they were read once, so
// they can), o is returned unchanged.
func (o *Object) withResourceVersion(rv string) *Object {
	if o.ResourceVersion == rv {
		return o
	}
	var data []byte
	var err error
	if IsProtobuf(o.Data) {
		data, err = protoWithResourceVersion(o.Data, rv)
	} else {
		data, err = jsonWithResourceVersion(o.Data, rv)
	}
	if err != nil {
		return o
	}
	c := *o
	c.Data, c.ResourceVersion = data, rv
	if c.mf != nil && !c.locateManaged() {
		return o // cannot happen: only the resourceVersion changed
	}
	return &c
}

// jsonWithResourceVersion returns a copy of the JSON object b with
// metadata.resourceVersion set to rv.
func jsonWithResourceVersion(b []byte, rv string) ([]byte, error) {
	s := &scanner{b: b}
	var at span // the value of metadata.resourceVersion, or of metadata
	found := false
	err := s.fields(func() error {
		k, err := s.member("metadata")
		if err != nil || k != 0 {
			if err == nil {
				err = s.skip()
			}
			return err
		}
		s.ws()
		metaStart := s.i
		if isNull, err := s.null(); isNull || err != nil {
			return err
		}
		err = s.fields(func() error {
			k, err := s.member("resourceVersion")
			if err != nil {
				return err
			}
			s.ws()
			from := s.i
			if err := s.skip(); err != nil {
				return err
			}
			if k == 0 {
				at, found = span{from, s.i}, true
			}
			return nil
		})
		if err == nil && !found {
			at = span{metaStart, metaStart + 1} // after the '{'
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	q, _ := json.Marshal(rv) // a string: cannot fail
	out := make([]byte, 0, len(b)+len(q)+20)
	switch {
	case found:
		out = append(append(append(out, b[:at.from]...), q...), b[at.to:]...)
	case at.to > 0: // metadata without a resourceVersion
		out = append(out, b[:at.to]...)
		out = append(append(append(out, `"resourceVersion":`...), q...), ',')
		if rest := b[at.to:]; len(rest) > 0 && firstNonSpace(rest) == '}' {
			out = out[:len(out)-1] // an empty metadata: no comma
		}
		out = append(out, b[at.to:]...)
	default: // no metadata: nothing to stamp
		return b, nil
	}
	return out, nil
}

func firstNonSpace(b []byte) byte {
	for _, c := range b {
		switch c {
		case ' ', '\t', '\r', '\n':
		default:
			return c
		}
	}
	return 0
}

// protoWithResourceVersion returns a copy of the encoded object data with
// its ObjectMeta's resourceVersion (field 6) set to rv.
func protoWithResourceVersion(data []byte, rv string) ([]byte, error) {
	apiVersion, kind, raw, err := protoUnknown(data)
	if err != nil {
		return nil, err
	}
	var msg []byte
	at := 0 // raw[:at] is in msg
	err = protoFields(raw, func(fd protoField) error {
		if fd.num != 1 {
			return nil
		}
		meta, err := protoMessage(fd)
		if err != nil {
			return err
		}
		var out []byte
		err = protoFields(meta, func(m protoField) error {
			if m.num != 6 {
				out = append(out, meta[m.start:m.end]...)
			}
			return nil
		})
		if err != nil {
			return err
		}
		out = protowire.AppendTag(out, 6, protowire.BytesType)
		out = protowire.AppendString(out, rv)
		msg = append(msg, raw[at:fd.start]...)
		msg = protowire.AppendTag(msg, 1, protowire.BytesType)
		msg = protowire.AppendBytes(msg, out)
		at = fd.end
		return nil
	})
	if err != nil {
		return nil, err
	}
	msg = append(msg, raw[at:]...)
	return appendProtoUnknown(nil, apiVersion, kind, msg), nil
}
