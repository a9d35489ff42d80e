package router

import (
	"encoding/base64"
	"time"
	"unicode/utf8"
)

// Byte-for-byte forms of what Kafka Connect writes for Debezium's records:
// Jackson's UTF8JsonGenerator (JsonConverter's writer) and Java's toString
// (StringConverter's).

const upperHex = "0123456789ABCDEF"

// appendJacksonString appends s (UTF-8, as Debezium decoded it into a Java
// String) as a JSON string exactly as Jackson's UTF8JsonGenerator writes
// it with Kafka Connect's defaults: '"' and '\\' escaped, \b \t \n \f \r
// short, other characters below U+0020 as \u00XX in upper-case hex, every
// character outside the Basic Multilingual Plane as its UTF-16 surrogate
// pair escaped (\uD83D\uDE42), everything else ('<', '&', '>', U+007F,
// U+2028, U+2029 included) as its UTF-8 bytes. A byte that is not UTF-8 is
// U+FFFD, as Java's decoder reads it.
func appendJacksonString(dst, s []byte) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		b := s[i]
		if b < utf8.RuneSelf {
			i++
			switch {
			case b == '"' || b == '\\':
				dst = append(dst, '\\', b)
			case b == '\b':
				dst = append(dst, '\\', 'b')
			case b == '\t':
				dst = append(dst, '\\', 't')
			case b == '\n':
				dst = append(dst, '\\', 'n')
			case b == '\f':
				dst = append(dst, '\\', 'f')
			case b == '\r':
				dst = append(dst, '\\', 'r')
			case b < 0x20:
				dst = append(dst, '\\', 'u', '0', '0', upperHex[b>>4], upperHex[b&0xF])
			default:
				dst = append(dst, b)
			}
			continue
		}
		r, n := utf8.DecodeRune(s[i:])
		i += n
		if r <= 0xFFFF {
			dst = utf8.AppendRune(dst, r) // RuneError for a bad byte: U+FFFD
			continue
		}
		r -= 0x10000
		dst = appendUEscape(dst, 0xD800+(r>>10))
		dst = appendUEscape(dst, 0xDC00+(r&0x3FF))
	}
	return append(dst, '"')
}

func appendUEscape(dst []byte, u rune) []byte {
	return append(dst, '\\', 'u', upperHex[u>>12&0xF], upperHex[u>>8&0xF], upperHex[u>>4&0xF], upperHex[u&0xF])
}

// appendJacksonBinary appends bytes as Jackson writes a byte[] (Connect's
// BYTES): a JSON string of their standard, padded base64.
func appendJacksonBinary(dst, b []byte) []byte {
	dst = append(dst, '"')
	dst = base64.StdEncoding.AppendEncode(dst, b)
	return append(dst, '"')
}

// appendBigDecimal appends Java's BigDecimal.toString of the BigDecimal
// Debezium makes from Postgres' text of a numeric with a declared scale
// (new BigDecimal(text): the scale is the number of fractional digits). It
// reports false for text that is not a finite decimal (NaN, Infinity).
func appendBigDecimal(dst, text []byte) ([]byte, bool) {
	s := text
	neg := len(s) > 0 && s[0] == '-'
	if neg {
		s = s[1:]
	}
	var digits []byte
	scale, point := 0, false
	for _, c := range s {
		switch {
		case c == '.' && !point:
			point = true
		case c >= '0' && c <= '9':
			if c != '0' || len(digits) > 0 {
				digits = append(digits, c)
			}
			if point {
				scale++
			}
		default:
			return dst, false
		}
	}
	if len(s) == 0 || s[0] == '.' || s[len(s)-1] == '.' {
		return dst, false
	}
	if len(digits) == 0 {
		digits = []byte{'0'}
	}
	if neg && !(len(digits) == 1 && digits[0] == '0') {
		// BigDecimal keeps no negative zero
		dst = append(dst, '-')
	}
	adjusted := len(digits) - 1 - scale
	switch {
	case scale == 0:
		return append(dst, digits...), true
	case adjusted >= -6:
		if n := len(digits) - scale; n > 0 {
			dst = append(dst, digits[:n]...)
			dst = append(dst, '.')
			return append(dst, digits[n:]...), true
		}
		dst = append(dst, '0', '.')
		for range scale - len(digits) {
			dst = append(dst, '0')
		}
		return append(dst, digits...), true
	}
	dst = append(dst, digits[0])
	if len(digits) > 1 {
		dst = append(dst, '.')
		dst = append(dst, digits[1:]...)
	}
	dst = append(dst, 'E')
	return appendInt(dst, adjusted), true
}

func appendInt(dst []byte, n int) []byte {
	if n < 0 {
		dst = append(dst, '-')
		n = -n
	}
	var buf [20]byte
	i := len(buf)
	for {
		i--
		buf[i] = byte('0' + n%10)
		if n /= 10; n == 0 {
			break
		}
	}
	return append(dst, buf[i:]...)
}

// appendEpochDay appends the days since 1970-01-01 of Postgres' ISO text of
// a date, the int32 Debezium sends a date as (time.precision.mode adaptive
// or connect). It reports false for infinity, BC dates and years past 9999.
func appendEpochDay(dst, text []byte) ([]byte, bool) {
	d, err := time.Parse(time.DateOnly, string(text))
	if err != nil {
		return dst, false
	}
	return appendInt(dst, int(d.Unix()/86400)), true
}
