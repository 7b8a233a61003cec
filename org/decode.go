package org

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
)

// decode reads body, a JSON object, into dst, a pointer to a struct of
// pointer fields tagged with their JSON names. A field of the wrong
// type is an Invalid error naming it; fields dst does not name are
// ignored, as the SDKs may send options tollgate has no use for. An empty
// body is an empty object.
func decode(body []byte, dst any) error {
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return nil
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil || raw == nil {
		return invalid("", "We could not parse the JSON body of your request: expected a JSON object.")
	}
	v := reflect.ValueOf(dst).Elem()
	t := v.Type()
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		msg, ok := raw[name]
		if !ok || bytes.Equal(msg, []byte("null")) {
			continue
		}
		if err := json.Unmarshal(msg, v.Field(i).Addr().Interface()); err != nil {
			return invalid(name, "Invalid type for '%s': expected %s.", name, typeName(t.Field(i).Type))
		}
	}
	return nil
}

// typeName names a field's JSON type in an error.
func typeName(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int64, reflect.Int:
		return "an integer"
	case reflect.Slice:
		return "an array of strings"
	}
	return "an object"
}
