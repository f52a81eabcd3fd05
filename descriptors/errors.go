package descriptors

import "fmt"

// Error is one problem found while loading the mapping config. Load and
// Parse return every problem they find, joined with errors.Join, so an
// operator fixes a broken directory in one pass instead of one error per
// reload.
type Error struct {
	File string // base name of the file
	Line int    // 1-based; 0 when the problem has no line (an unreadable file)
	Msg  string
	Err  error // the underlying error, if any (an I/O error, for errors.Is)
}

func (e *Error) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
	}
	return e.File + ": " + e.Msg
}

func (e *Error) Unwrap() error { return e.Err }
