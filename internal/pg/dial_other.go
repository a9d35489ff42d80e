//go:build !linux

package pg

import "syscall"

func setUserTimeout(string, string, syscall.RawConn) error { return nil }
