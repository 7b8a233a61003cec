package telemetry

import (
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/otel/attribute"
)

// attrList is the attributes of a span, or of a span's event, listed in
// the order they are set, to be set over those it held in an earlier
// batch (setOver). It lives on the builder's stack: listing an attribute
// writes no pointer to the heap, and so costs no write barrier while the
// garbage collector runs.
type attrList struct {
	n int
	a [maxSpanAttrs]attr
}

// attr is an attribute to set: its key and its value, of type typ.
type attr struct {
	key  string
	typ  pcommon.ValueType
	str  string
	num  int64 // an int, or a bool as 0 or 1
	dbl  float64
	strs []string
}

// str lists the string attribute key, with v made valid UTF-8.
func (l *attrList) str(key, v string) { l.trusted(key, validUTF8(v)) }

// trusted lists the string attribute key, with v, which is valid UTF-8.
func (l *attrList) trusted(key, v string) {
	l.a[l.n] = attr{key: key, typ: pcommon.ValueTypeStr, str: v}
	l.n++
}

// constant lists one of semconv's constant string attributes.
func (l *attrList) constant(kv attribute.KeyValue) { l.trusted(string(kv.Key), kv.Value.AsString()) }

// int lists the int attribute key.
func (l *attrList) int(key string, v int64) {
	l.a[l.n] = attr{key: key, typ: pcommon.ValueTypeInt, num: v}
	l.n++
}

// boolean lists the bool attribute key.
func (l *attrList) boolean(key string, v bool) {
	var num int64
	if v {
		num = 1
	}
	l.a[l.n] = attr{key: key, typ: pcommon.ValueTypeBool, num: num}
	l.n++
}

// double lists the double attribute key.
func (l *attrList) double(key string, v float64) {
	l.a[l.n] = attr{key: key, typ: pcommon.ValueTypeDouble, dbl: v}
	l.n++
}

// strings lists the string array attribute key, its elements to be made
// valid UTF-8 as they are set.
func (l *attrList) strings(key string, ss []string) {
	l.a[l.n] = attr{key: key, typ: pcommon.ValueTypeSlice, strs: ss}
	l.n++
}

// setOver makes m hold exactly the listed attributes. pdata's Map finds a
// key by scanning its entries; spans of one shape in a row list the same
// keys in the same order, so each attribute is first set over the entry
// at its own place, and only from the first that is not there on does
// setOver look entries up by key.
func (l *attrList) setOver(m pcommon.Map) {
	m.EnsureCapacity(l.n)
	i := 0
	for k, v := range m.All() {
		if i == l.n || k != l.a[i].key || v.Type() != l.a[i].typ {
			break
		}
		l.a[i].setTo(v)
		i++
	}
	// Past the first entry out of place, an attribute may add an entry,
	// which moves the others: each is looked up.
	for ; i < l.n; i++ {
		a := &l.a[i]
		v, ok := m.Get(a.key)
		if !ok || v.Type() != a.typ {
			v = m.PutEmpty(a.key)
		}
		a.setTo(v)
	}
	if m.Len() != l.n {
		m.RemoveIf(func(k string, _ pcommon.Value) bool { return !l.has(k) })
	}
}

// has says whether key is listed.
func (l *attrList) has(key string) bool {
	for i := range l.n {
		if l.a[i].key == key {
			return true
		}
	}
	return false
}

// setTo sets v to a's value, over v's message when it has a's type.
func (a *attr) setTo(v pcommon.Value) {
	switch a.typ {
	case pcommon.ValueTypeStr:
		v.SetStr(a.str)
	case pcommon.ValueTypeInt:
		v.SetInt(a.num)
	case pcommon.ValueTypeBool:
		v.SetBool(a.num != 0)
	case pcommon.ValueTypeDouble:
		v.SetDouble(a.dbl)
	case pcommon.ValueTypeSlice:
		setStrings(v, a.strs)
	}
}

// setStrings sets v to the string array ss, made valid UTF-8, over v's
// elements when v is an array.
func setStrings(v pcommon.Value, ss []string) {
	var arr pcommon.Slice
	if v.Type() == pcommon.ValueTypeSlice {
		arr = v.Slice()
	} else {
		arr = v.SetEmptySlice()
	}
	for i, s := range ss {
		if i < arr.Len() {
			arr.At(i).SetStr(validUTF8(s))
		} else {
			arr.AppendEmpty().SetStr(validUTF8(s))
		}
	}
	if arr.Len() > len(ss) {
		i := 0
		arr.RemoveIf(func(pcommon.Value) bool { i++; return i > len(ss) })
	}
}
