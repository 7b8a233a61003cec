package bytesconv

import "testing"

func TestViewsShareMemory(t *testing.T) {
	b := []byte("model")
	s := String(b)
	if s != "model" {
		t.Fatalf("String = %q", s)
	}
	b[0] = 'M'
	if s != "Model" {
		t.Fatalf("String copied: %q after the bytes changed", s)
	}
	if got := Bytes("abc"); string(got) != "abc" || len(got) != 3 {
		t.Fatalf("Bytes = %q", got)
	}
	if n := testing.AllocsPerRun(100, func() { _ = String(b); _ = Bytes(s) }); n != 0 {
		t.Fatalf("the views allocate %v times", n)
	}
}
