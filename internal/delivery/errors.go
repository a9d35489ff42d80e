package delivery

// hintError is err with what to do about it apart: its Hint, which the
// command prints on a line of its own (relay.Hint).
type hintError struct {
	err  error
	hint string
}

func (e *hintError) Error() string { return e.err.Error() }
func (e *hintError) Unwrap() error { return e.err }
func (e *hintError) Hint() string  { return e.hint }

// kindError is a sentinel of the pipeline's own that classifies itself
// (Permanent, read by relay.IsPermanent).
type kindError struct {
	text      string
	permanent bool
}

func (e *kindError) Error() string   { return e.text }
func (e *kindError) Permanent() bool { return e.permanent }
