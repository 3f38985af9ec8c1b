package cache

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// This file reads objects the API server encodes as protobuf (built-in
// types) without decoding them into Go types: the cache needs only the
// type and a few metadata fields, and keeps the bytes.
//
// An encoded object is "k8s\x00" followed by a runtime.Unknown message:
// typeMeta (1: apiVersion 1, kind 2), raw (2: the typed message), and
// contentEncoding/contentType (3, 4). Every built-in type's message has its
// ObjectMeta as field 1: name 1, namespace 3, uid 5, resourceVersion 6,
// labels 11 (map entries: key 1, value 2), managedFields 17.

// protoMagic starts every object the API server encodes as protobuf.
var protoMagic = []byte("k8s\x00")

// IsProtobuf reports whether an object's bytes are protobuf (else JSON).
func IsProtobuf(data []byte) bool { return bytes.HasPrefix(data, protoMagic) }

var errBadProto = errors.New("malformed protobuf")

// protoField is one field of a message: its number, wire type, the bytes
// of a length-delimited value, and where the whole field (tag included)
// starts and ends in the message.
type protoField struct {
	num        protowire.Number
	typ        protowire.Type
	value      []byte
	start, end int
}

// protoFields calls f for each field of msg.
func protoFields(msg []byte, f func(protoField) error) error {
	for i := 0; i < len(msg); {
		num, typ, n := protowire.ConsumeTag(msg[i:])
		if n < 0 {
			return fmt.Errorf("%w: %w", errBadProto, protowire.ParseError(n))
		}
		fd := protoField{num: num, typ: typ, start: i}
		m := protowire.ConsumeFieldValue(num, typ, msg[i+n:])
		if m < 0 {
			return fmt.Errorf("%w: %w", errBadProto, protowire.ParseError(m))
		}
		if typ == protowire.BytesType {
			fd.value, _ = protowire.ConsumeBytes(msg[i+n:])
		}
		i += n + m
		fd.end = i
		if err := f(fd); err != nil {
			return err
		}
	}
	return nil
}

// protoString returns a string field's value; a string of another wire
// type, or of invalid UTF-8, is malformed.
func protoString(fd protoField) (string, error) {
	if fd.typ != protowire.BytesType || !utf8.Valid(fd.value) {
		return "", fmt.Errorf("%w: field %d is not a string", errBadProto, fd.num)
	}
	return string(fd.value), nil
}

// protoMessage returns an embedded message field's bytes.
func protoMessage(fd protoField) ([]byte, error) {
	if fd.typ != protowire.BytesType {
		return nil, fmt.Errorf("%w: field %d is not a message", errBadProto, fd.num)
	}
	return fd.value, nil
}

// protoPair reads the string fields a and b of the message in fd: a map
// entry (key 1, value 2), a TypeMeta (apiVersion 1, kind 2), a ListMeta's
// resourceVersion and continue (2, 3).
func protoPair(fd protoField, a, b protowire.Number) (string, string, error) {
	msg, err := protoMessage(fd)
	if err != nil {
		return "", "", err
	}
	var x, y string
	err = protoFields(msg, func(fd protoField) error {
		var err error
		switch fd.num {
		case a:
			x, err = protoString(fd)
		case b:
			y, err = protoString(fd)
		}
		return err
	})
	return x, y, err
}

// protoUnknown splits an encoded object into its type and typed message.
func protoUnknown(data []byte) (apiVersion, kind string, raw []byte, err error) {
	if !IsProtobuf(data) {
		return "", "", nil, fmt.Errorf("%w: no k8s protobuf prefix", errBadProto)
	}
	err = protoFields(data[len(protoMagic):], func(fd protoField) error {
		switch fd.num {
		case 1:
			apiVersion, kind, err = protoPair(fd, 1, 2)
			return err
		case 2:
			raw, err = protoMessage(fd)
			return err
		case 3: // contentEncoding: the API server sets none
			if s, err := protoString(fd); err != nil || s != "" {
				return fmt.Errorf("%w: content encoding %q is not supported", errBadProto, s)
			}
		}
		return nil
	})
	return apiVersion, kind, raw, err
}

// appendProtoUnknown appends an encoded object: the prefix and a
// runtime.Unknown of the type and the typed message raw. With b nil, it
// allocates the result at its exact size: it is what the store keeps.
func appendProtoUnknown(b []byte, apiVersion, kind string, raw []byte) []byte {
	tmSize := protowire.SizeTag(1) + protowire.SizeBytes(len(apiVersion)) +
		protowire.SizeTag(2) + protowire.SizeBytes(len(kind))
	if b == nil {
		b = make([]byte, 0, len(protoMagic)+
			protowire.SizeTag(1)+protowire.SizeBytes(tmSize)+
			protowire.SizeTag(2)+protowire.SizeBytes(len(raw)))
	}
	b = append(b, protoMagic...)
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(tmSize))
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, apiVersion)
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendString(b, kind)
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	return protowire.AppendBytes(b, raw)
}

// decodeProtoObject reads the type and metadata of an object encoded as
// protobuf. If strip is set and it has managedFields, the returned
// Object's bytes are re-encoded without them; otherwise they are data
// itself.
func decodeProtoObject(data []byte, strip bool) (*Object, header, error) {
	apiVersion, kind, raw, err := protoUnknown(data)
	if err != nil {
		return nil, header{}, fmt.Errorf("decoding object: %w", err)
	}
	o := &Object{Data: data}
	h := header{apiVersion: apiVersion, kind: kind}
	stripped, err := readProtoMeta(o, &h, raw, strip)
	if err != nil {
		return nil, header{}, fmt.Errorf("decoding object: %w", err)
	}
	if stripped != nil {
		o.Data = appendProtoUnknown(nil, apiVersion, kind, stripped)
	}
	return o, h, nil
}

// readProtoMeta reads the ObjectMeta (field 1) of a typed message into o
// and h. If strip is set and there are managedFields, it returns the message
// without them; else nil.
func readProtoMeta(o *Object, h *header, msg []byte, strip bool) ([]byte, error) {
	var out []byte // the message rebuilt, once something is cut
	at := 0        // msg[:at] is in out
	err := protoFields(msg, func(fd protoField) error {
		if fd.num != 1 {
			return nil
		}
		meta, err := protoMessage(fd)
		if err != nil {
			return err
		}
		var keep []byte // meta without managedFields, once one is seen
		kept := 0
		err = protoFields(meta, func(fd protoField) error {
			var err error
			switch fd.num {
			case 1:
				o.Name, err = protoString(fd)
			case 3:
				o.Namespace, err = protoString(fd)
			case 5:
				h.uid, err = protoString(fd)
			case 6:
				o.ResourceVersion, err = protoString(fd)
			case 11:
				err = readProtoLabel(o, fd)
			case 17:
				if strip {
					keep = append(keep, meta[kept:fd.start]...)
					kept = fd.end
				}
			}
			return err
		})
		if err != nil || kept == 0 {
			return err
		}
		keep = append(keep, meta[kept:]...)
		out = append(out, msg[at:fd.start]...)
		out = protowire.AppendTag(out, 1, protowire.BytesType)
		out = protowire.AppendBytes(out, keep)
		at = fd.end
		return nil
	})
	if err != nil || out == nil {
		return nil, err
	}
	return append(out, msg[at:]...), nil
}

// readProtoLabel adds one labels map entry to o.
func readProtoLabel(o *Object, fd protoField) error {
	k, v, err := protoPair(fd, 1, 2)
	if err != nil {
		return err
	}
	if o.Labels == nil {
		o.Labels = map[string]string{}
	}
	o.Labels[k] = v
	return nil
}

// protoWatchEvent splits a metav1.WatchEvent message (type 1, object 2: a
// RawExtension whose raw 1 is an encoded object).
func protoWatchEvent(msg []byte) (typ string, obj []byte, err error) {
	err = protoFields(msg, func(fd protoField) error {
		var err error
		switch fd.num {
		case 1:
			typ, err = protoString(fd)
		case 2:
			ext, err := protoMessage(fd)
			if err != nil {
				return err
			}
			return protoFields(ext, func(fd protoField) error {
				if fd.num == 1 {
					obj, err = protoMessage(fd)
				}
				return err
			})
		}
		return err
	})
	return typ, obj, err
}

// protoBookmark reads a bookmark object's resourceVersion and whether its
// annotations mark the end of a WatchList's initial events.
func protoBookmark(data []byte) (rv string, initialEventsEnd bool, err error) {
	_, _, raw, err := protoUnknown(data)
	if err != nil {
		return "", false, err
	}
	err = protoFields(raw, func(fd protoField) error {
		if fd.num != 1 {
			return nil
		}
		meta, err := protoMessage(fd)
		if err != nil {
			return err
		}
		return protoFields(meta, func(fd protoField) error {
			var err error
			switch fd.num {
			case 6:
				rv, err = protoString(fd)
			case 12: // an annotation
				var k, v string
				k, v, err = protoPair(fd, 1, 2)
				if k == metav1.InitialEventsAnnotationKey && v == "true" {
					initialEventsEnd = true
				}
			}
			return err
		})
	})
	return rv, initialEventsEnd, err
}

// protoList reads a LIST response: its resourceVersion and continue token
// (ListMeta: 2, 3) and its items (2), each returned as an Object of the
// list's item type.
func protoList(data []byte, strip bool) (objs []*Object, rv, cont string, err error) {
	apiVersion, listKind, raw, err := protoUnknown(data)
	if err != nil {
		return nil, "", "", err
	}
	kind := strings.TrimSuffix(listKind, "List")
	err = protoFields(raw, func(fd protoField) error {
		switch fd.num {
		case 1:
			rv, cont, err = protoPair(fd, 2, 3)
			return err
		case 2:
			item, err := protoMessage(fd)
			if err != nil {
				return err
			}
			o := &Object{}
			stripped, err := readProtoMeta(o, &header{}, item, strip)
			if err != nil {
				return err
			}
			if stripped != nil {
				item = stripped
			}
			o.Data = appendProtoUnknown(nil, apiVersion, kind, item)
			objs = append(objs, o)
		}
		return nil
	})
	return objs, rv, cont, err
}
