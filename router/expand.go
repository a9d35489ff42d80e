package router

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
)

// Debezium's table.expand.json.payload, reproduced: Jackson's readTree of
// the payload string, JsonSchemaData's Connect schema inference (with the
// default null and empty-array behaviour, ignore) and conversion, and
// JsonConverter (schemas off) writing the result. Where Debezium declines
// to expand (a payload that does not start with '{' or '[', is not JSON,
// or whose schema cannot be inferred), it sends the payload string itself,
// which JsonConverter writes as a JSON string; where its task dies (a
// top-level array, an integer beyond int64, values of one field of
// different types), errDebeziumDies says so.

// errDebeziumDies marks a payload on which Debezium's task fails: there is
// no record of Debezium's to reproduce, so the row is a poison row.
var errDebeziumDies = errors.New("the EventRouter of Debezium fails on it (its Kafka Connect task dies)")

// Bounds of the expansion. Jackson (2.15 and later) refuses to read JSON
// nested deeper than maxNesting, and Debezium then sends the payload as a
// string; the recursion here stops at the same depth. maxShapes and
// maxExpanded bound the work and memory of an array of objects of many
// shapes, each written with the fields of all of them (Debezium merges
// them): past them the row is a poison row instead of an out-of-memory
// crash that would repeat at every restart.
const (
	maxNesting  = 1000
	maxShapes   = 1024
	maxExpanded = 64 << 20
)

var errTooDeep = errors.New("nested deeper than 1000 levels")

// errTooLarge marks a payload whose expansion outboxd refuses to build.
var errTooLarge = errors.New("outboxd does not expand it: a poison row")

// kind is a Jackson node type, with NUMBER split as JsonSchemaData splits it.
type kind int

const (
	kNull kind = iota
	kString
	kBool
	kInt32
	kInt64
	kBigInt // beyond int64: Jackson's BigIntegerNode
	kDouble
	kArray
	kObject
)

// node is a Jackson tree node.
type node struct {
	kind  kind
	text  string  // string value, or a number's token
	bool  bool    // boolean value
	float float64 // kDouble's value
	elems []*node // array elements
	keys  []string
	vals  map[string]*node // object members: keys in first-seen order, the last value (ObjectNode.set)
}

// schema is an inferred Connect schema (always optional).
type schema struct {
	kind   kind     // kString, kBool, kInt32, kInt64, kDouble, kArray, kObject
	elem   *schema  // kArray's value schema
	fields []sfield // kObject's fields
}

type sfield struct {
	name   string
	schema *schema
}

func (s *schema) field(name string) *schema {
	for _, f := range s.fields {
		if f.name == name {
			return f.schema
		}
	}
	return nil
}

func (s *schema) equal(o *schema) bool {
	if s == nil || o == nil {
		return s == o
	}
	if s.kind != o.kind || !s.elem.equal(o.elem) || len(s.fields) != len(o.fields) {
		return false
	}
	for i := range s.fields {
		if s.fields[i].name != o.fields[i].name || !s.fields[i].schema.equal(o.fields[i].schema) {
			return false
		}
	}
	return true
}

// appendExpanded appends the value Debezium wrote for payload text p with
// expansion on, under JsonConverter with schemas off.
func appendExpanded(dst, p []byte) ([]byte, error) {
	if len(p) == 0 || p[0] != '{' && p[0] != '[' {
		return appendJacksonString(dst, p), nil // "Unable to parse payload starting with ..."
	}
	root, err := readTree(p)
	if err != nil {
		return appendJacksonString(dst, p), nil // JSON expansion failed: sent as it was
	}
	s, err := inferSchema(root)
	if errors.Is(err, errTooLarge) {
		return dst, err
	}
	if err != nil {
		return appendJacksonString(dst, p), nil
	}
	if root.kind == kArray {
		if s == nil { // [] has no schema; toConnectData fails, the string is sent
			return appendJacksonString(dst, p), nil
		}
		return dst, fmt.Errorf("the payload is a JSON array: %w", errDebeziumDies)
	}
	out, err := appendConverted(dst, root, s)
	if err != nil {
		return dst, err
	}
	return out, nil
}

// readTree parses the first JSON value of p as Jackson's readTree does
// (trailing content is not read); numbers keep Jackson's node types.
func readTree(p []byte) (*node, error) {
	d := json.NewDecoder(bytes.NewReader(p))
	d.UseNumber()
	return readNode(d, 0)
}

func readNode(d *json.Decoder, depth int) (*node, error) {
	t, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch v := t.(type) {
	case nil:
		return &node{kind: kNull}, nil
	case string:
		return &node{kind: kString, text: v}, nil
	case bool:
		return &node{kind: kBool, bool: v}, nil
	case json.Number:
		return numberNode(string(v))
	case json.Delim:
		if depth++; depth > maxNesting {
			return nil, errTooDeep
		}
		if v == '[' {
			n := &node{kind: kArray}
			for d.More() {
				e, err := readNode(d, depth)
				if err != nil {
					return nil, err
				}
				n.elems = append(n.elems, e)
			}
			_, err := d.Token()
			return n, err
		}
		n := &node{kind: kObject, vals: map[string]*node{}}
		for d.More() {
			kt, err := d.Token()
			if err != nil {
				return nil, err
			}
			k := kt.(string)
			e, err := readNode(d, depth)
			if err != nil {
				return nil, err
			}
			if _, dup := n.vals[k]; !dup {
				n.keys = append(n.keys, k)
			}
			n.vals[k] = e
		}
		_, err := d.Token()
		return n, err
	}
	return nil, fmt.Errorf("unexpected token %v", t)
}

// numberNode types a number token as Jackson does: an integer as an int if
// it fits, else a long, else a BigInteger; anything with a fraction or an
// exponent as a double.
func numberNode(tok string) (*node, error) {
	if !strings.ContainsAny(tok, ".eE") {
		if i, err := strconv.ParseInt(tok, 10, 64); err == nil {
			if i >= math.MinInt32 && i <= math.MaxInt32 {
				return &node{kind: kInt32, text: strconv.FormatInt(i, 10)}, nil
			}
			return &node{kind: kInt64, text: strconv.FormatInt(i, 10)}, nil
		}
		return &node{kind: kBigInt, text: tok}, nil
	}
	f, err := strconv.ParseFloat(tok, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return nil, err
	}
	return &node{kind: kDouble, float: f, text: tok}, nil
}

// errNoSchema is a ConnectException of JsonSchemaData's schema inference:
// Debezium then sends the payload unexpanded.
var errNoSchema = errors.New("no schema")

// inferSchema is JsonSchemaData.toConnectSchema; nil for a node without a
// schema (null, an empty array).
func inferSchema(n *node) (*schema, error) {
	switch n.kind {
	case kString, kBool, kInt32, kInt64:
		return &schema{kind: n.kind}, nil
	case kBigInt, kDouble:
		return &schema{kind: kDouble}, nil
	case kArray:
		if len(n.elems) == 0 {
			return nil, nil
		}
		elem, err := arraySchema(n)
		if err != nil {
			return nil, err
		}
		return &schema{kind: kArray, elem: elem}, nil
	case kObject:
		s := &schema{kind: kObject}
		for _, k := range n.keys {
			fs, err := inferSchema(n.vals[k])
			if err != nil {
				return nil, err
			}
			if fs != nil {
				s.fields = append(s.fields, sfield{k, fs})
			}
		}
		return s, nil
	}
	return nil, nil
}

// arraySchema is toConnectSchemaWithCycles: the first non-null element's
// schema, all elements of one type (numbers of one schema); for objects
// the merge of the distinct element schemas. Debezium merges them in the
// order of a HashSet of schemas, which follows Java identity hash codes
// and so varies between runs; outboxd merges in order of appearance.
func arraySchema(n *node) (*schema, error) {
	var ref *node
	var refSchema *schema
	for _, e := range n.elems {
		if e.kind == kNull {
			continue
		}
		if ref == nil {
			ref = e
		}
		if nodeType(e.kind) != nodeType(ref.kind) {
			return nil, errNoSchema // "Field is not a homogenous array"
		}
		if nodeType(ref.kind) == kDouble {
			if refSchema == nil {
				refSchema, _ = inferSchema(ref)
			}
			if es, _ := inferSchema(e); es.kind != refSchema.kind {
				return nil, errNoSchema
			}
		}
	}
	if ref == nil {
		return nil, errNoSchema // "Array ... has unrecognized member schema"
	}
	if ref.kind != kObject {
		s, err := inferSchema(ref)
		if err != nil {
			return nil, err
		}
		if s == nil {
			return nil, errNoSchema
		}
		return s, nil
	}
	var distinct []*schema
	for _, e := range n.elems {
		if e.kind != kObject {
			continue
		}
		s, err := inferSchema(e)
		if err != nil {
			return nil, err
		}
		seen := false
		for _, d := range distinct {
			seen = seen || d.equal(s)
		}
		if !seen {
			if len(distinct) == maxShapes {
				return nil, fmt.Errorf("an array holds objects of more than %d shapes, each of which would be written with the fields of all: %w", maxShapes, errTooLarge)
			}
			distinct = append(distinct, s)
		}
	}
	merged := distinct[0]
	for _, s := range distinct[1:] {
		m := &schema{kind: kObject, fields: append([]sfield(nil), merged.fields...)}
		for _, f := range s.fields {
			if m.field(f.name) == nil {
				m.fields = append(m.fields, f)
			}
		}
		merged = m
	}
	return merged, nil
}

// nodeType is Jackson's JsonNodeType: all numbers are NUMBER.
func nodeType(k kind) kind {
	switch k {
	case kInt32, kInt64, kBigInt, kDouble:
		return kDouble
	}
	return k
}

// appendConverted appends n converted to schema s (toConnectData, whose
// Struct.put validates each value against its schema) as JsonConverter
// writes it; a value that does not fit its schema is where Debezium dies.
func appendConverted(dst []byte, n *node, s *schema) ([]byte, error) {
	if n == nil || n.kind == kNull {
		return append(dst, "null"...), nil
	}
	if s == nil {
		return dst, fmt.Errorf("a value without a schema: %w", errDebeziumDies)
	}
	switch {
	case n.kind == kObject && s.kind == kObject:
		dst = append(dst, '{')
		for i, f := range s.fields {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendJacksonString(dst, []byte(f.name))
			dst = append(dst, ':')
			var err error
			if dst, err = appendConverted(dst, n.vals[f.name], f.schema); err != nil {
				return dst, err
			}
		}
		return append(dst, '}'), nil
	case n.kind == kArray && s.kind == kArray:
		dst = append(dst, '[')
		for i, e := range n.elems {
			if i > 0 {
				dst = append(dst, ',')
			}
			if len(dst) > maxExpanded {
				return dst, fmt.Errorf("the expanded value passes %d MiB: %w", maxExpanded>>20, errTooLarge)
			}
			var err error
			if dst, err = appendConverted(dst, e, s.elem); err != nil {
				return dst, err
			}
		}
		return append(dst, ']'), nil
	case n.kind == kString && s.kind == kString:
		return appendJacksonString(dst, []byte(n.text)), nil
	case n.kind == kBool && s.kind == kBool:
		return strconv.AppendBool(dst, n.bool), nil
	case (n.kind == kInt32 || n.kind == kInt64) && s.kind == n.kind:
		return append(dst, n.text...), nil
	case n.kind == kDouble && s.kind == kDouble:
		if math.IsInf(n.float, 0) {
			return dst, fmt.Errorf("the number %s is beyond a double: %w", n.text, errDebeziumDies)
		}
		return appendJavaDouble(dst, n.float), nil
	case n.kind == kBigInt:
		return dst, fmt.Errorf("the integer %s is beyond int64: %w", n.text, errDebeziumDies)
	}
	return dst, fmt.Errorf("a value does not fit the schema inferred from the first of its kind: %w", errDebeziumDies)
}

// appendJavaDouble appends Double.toString(f) as Java 19 and later print
// it (and Jackson writes a double): the shortest decimal that reads back
// as f (of one or two digits, the closer, when one digit would do), plain
// between 10^-3 and 10^7 with at least one fractional digit, else
// d.dddE±n.
func appendJavaDouble(dst []byte, f float64) []byte {
	if f == 0 {
		if math.Signbit(f) {
			return append(dst, "-0.0"...)
		}
		return append(dst, "0.0"...)
	}
	digits, exp := shortestDigits(f)
	if f < 0 {
		dst = append(dst, '-')
	}
	abs := math.Abs(f)
	if abs >= 1e-3 && abs < 1e7 {
		// exp is the decimal exponent of the first digit
		if exp < 0 {
			dst = append(dst, "0."...)
			for range -exp - 1 {
				dst = append(dst, '0')
			}
			return append(dst, digits...)
		}
		if len(digits) <= exp+1 {
			dst = append(dst, digits...)
			for range exp + 1 - len(digits) {
				dst = append(dst, '0')
			}
			return append(dst, ".0"...)
		}
		dst = append(dst, digits[:exp+1]...)
		dst = append(dst, '.')
		return append(dst, digits[exp+1:]...)
	}
	dst = append(dst, digits[0], '.')
	if len(digits) > 1 {
		dst = append(dst, digits[1:]...)
	} else {
		dst = append(dst, '0')
	}
	dst = append(dst, 'E')
	return strconv.AppendInt(dst, int64(exp), 10)
}

// shortestDigits returns the significant digits and the decimal exponent
// of the first of Java's choice for f: the shortest that reads back as f;
// when that is one digit, the closer to f of it and the best two-digit one.
func shortestDigits(f float64) (string, int) {
	s := strconv.FormatFloat(math.Abs(f), 'e', -1, 64) // d.ddde±xx
	mant, e, _ := strings.Cut(s, "e")
	exp, _ := strconv.Atoi(e)
	digits := strings.Replace(mant, ".", "", 1)
	if len(digits) == 1 {
		two := strconv.FormatFloat(math.Abs(f), 'e', 1, 64)
		if v, err := strconv.ParseFloat(two, 64); err == nil && v == math.Abs(f) {
			x := new(big.Float).SetPrec(2000).SetFloat64(math.Abs(f))
			d1, _, _ := big.ParseFloat(s, 10, 2000, big.ToNearestEven)
			d2, _, _ := big.ParseFloat(two, 10, 2000, big.ToNearestEven)
			dist1 := new(big.Float).Sub(d1, x)
			dist2 := new(big.Float).Sub(d2, x)
			if dist2.Abs(dist2).Cmp(dist1.Abs(dist1)) < 0 {
				m2, e2, _ := strings.Cut(two, "e")
				exp, _ = strconv.Atoi(e2)
				return strings.Replace(m2, ".", "", 1), exp
			}
		}
	}
	return digits, exp
}
