package regions

import (
	"strings"
	"testing"
)

func TestEncodeRoundTrip(t *testing.T) {
	rec := Record{
		Out: map[Region]Loans{"us-east-1": {{Made: 100, From: 101, To: 104, Parts: 250_000}, {Made: 101, From: 102, To: 104, Parts: 1_000, Back: 103}}},
		In:  map[Region]Loans{"eu-west-1": {{Made: 99, From: 100, To: 103, Parts: Total}}},
	}
	b, err := Encode(rec)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Equal(rec) {
		t.Errorf("Decode(Encode(%v)) = %v", rec, got)
	}
	if empty, err := Encode(Record{}); err != nil || string(empty) != `{"v":1}` {
		t.Errorf("the empty record encodes as %s (%v)", empty, err)
	}
}

func TestDecodeRefuses(t *testing.T) {
	for _, c := range []struct{ in, why string }{
		{`{"v":2}`, "format 2"},
		{`{"o":{}}`, "format 0"},
		{`{"v":1,"o":{"us":[[1,2,3,0,0]]}}`, "not a loan"},
		{`{"v":1,"o":{"us":[[1,2,3,1000001,0]]}}`, "not a loan"},
		{`{"v":1,"i":{"us":[[1,5,3,10,0]]}}`, "not a loan"},
		{`{"v":1,"i":{"us":[[1,5,6,10,4]]}}`, "not a loan"},
		{`{"v":1,"i":{"":[[1,5,6,10,0]]}}`, "not a loan"},
		{`{"v":1,"i":{"us":[[1,5,6]]}}`, "decoding"},
		{`{"v":1,"i":{"us":[[1,5,6,10,0,7]]}}`, "decoding"},
		{`not json`, "decoding"},
		{`{"v":1,"o":{"us":[` + strings.Repeat(`[1,2,3,4,0],`, MaxLoans) + `[1,2,3,4,0]]}}`, "over 64"},
		{`{"v":1,"o":{"x":"` + strings.Repeat("y", MaxEncoded) + `"}}`, "bytes is over"},
	} {
		if _, err := Decode([]byte(c.in)); err == nil || !strings.Contains(err.Error(), c.why) {
			t.Errorf("Decode(%.60s): %v, want an error saying %q", c.in, err, c.why)
		}
	}
	if _, err := Encode(Record{Out: map[Region]Loans{"us": {{From: 3, To: 2, Parts: 1}}}}); err == nil {
		t.Error("Encode took a loan that ends before it starts")
	}
}

// FuzzDecode: no input makes Decode panic, and what it takes encodes
// back to a record it decodes alike.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"v":1,"o":{"us":[[1,2,3,4,0]]},"i":{"eu":[[5,6,7,8,7]]}}`))
	f.Add([]byte(`{"v":1}`))
	f.Add([]byte(`{"v":1,"o":{"us":[[-9223372036854775808,2,9223372036854775807,4,0]]}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, err := Decode(b)
		if err != nil {
			return
		}
		again, err := Encode(rec)
		if err != nil {
			t.Fatalf("Decode took %q but Encode refuses it: %v", b, err)
		}
		back, err := Decode(again)
		if err != nil || !back.Equal(rec) {
			t.Fatalf("%q: decoded %v, re-encoded %s, decoded again %v (%v)", b, rec, again, back, err)
		}
	})
}
