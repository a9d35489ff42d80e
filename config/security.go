package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
)

// TLS configures TLS to the Kafka brokers.
type TLS struct {
	Enabled bool `yaml:"enabled"`
	// CAFile is a PEM file of the CA certificates that sign the brokers'
	// certificates; "" trusts the system's roots.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are the client's certificate and unencrypted
	// private key (PEM), for brokers that require client authentication
	// (ssl.client.auth=required). Both or neither.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerName is the name the brokers' certificates must carry; "" uses
	// the host of each broker address.
	ServerName string `yaml:"server_name"`
}

// SASL configures SASL authentication to the Kafka brokers. Combine it
// with TLS (SASL_SSL): without TLS, PLAIN sends the password in clear.
type SASL struct {
	// Mechanism is "" (no SASL), PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
	Mechanism string `yaml:"mechanism"`
	Username  string `yaml:"username"`
	// Password, or PasswordFile naming a file that holds it (a mounted
	// secret, read at every connection; one trailing newline is ignored).
	// Set one of them.
	Password     string `yaml:"password"`
	PasswordFile string `yaml:"password_file"`
}

// SASL mechanisms.
const (
	MechanismPlain       = "PLAIN"
	MechanismScramSHA256 = "SCRAM-SHA-256"
	MechanismScramSHA512 = "SCRAM-SHA-512"
)

// Password returns the password from postgres.password_file, or "" when
// no file is configured (the DSN, PGPASSWORD or ~/.pgpass then apply).
func (p Postgres) Password() (string, error) {
	if p.PasswordFile == "" {
		return "", nil
	}
	return readSecret("postgres.password_file", p.PasswordFile)
}

// Secret returns the SASL password, reading kafka.sasl.password_file when
// set.
func (s SASL) Secret() (string, error) {
	if s.PasswordFile != "" {
		return readSecret("kafka.sasl.password_file", s.PasswordFile)
	}
	return s.Password, nil
}

// readSecret reads a secret file. Its errors name the field and the file,
// never the content.
func readSecret(field, path string) (string, error) {
	b, err := os.ReadFile(path) // its errors name the path, never the content
	if err != nil {
		return "", fmt.Errorf("%s: cannot read the secret file: %w", field, err)
	}
	s := strings.TrimSuffix(string(b), "\n")
	s = strings.TrimSuffix(s, "\r")
	if s == "" {
		return "", fmt.Errorf("%s: %s is empty", field, path)
	}
	return s, nil
}

// Config returns the TLS client configuration, or nil when TLS is off.
// Errors name the field at fault.
func (t TLS) Config() (*tls.Config, error) {
	if !t.Enabled {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("kafka.tls.ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("kafka.tls.ca_file: %s holds no PEM certificate", t.CAFile)
		}
		cfg.RootCAs = pool
	}
	switch {
	case t.CertFile != "" && t.KeyFile != "":
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("kafka.tls.cert_file, kafka.tls.key_file: not a PEM certificate and its unencrypted private key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	case t.CertFile != "":
		return nil, errors.New("kafka.tls.key_file: must be set when kafka.tls.cert_file is")
	case t.KeyFile != "":
		return nil, errors.New("kafka.tls.cert_file: must be set when kafka.tls.key_file is")
	}
	return cfg, nil
}

func (p Postgres) validateSecrets() []error {
	if p.PasswordFile == "" {
		return nil
	}
	if _, err := p.Password(); err != nil {
		return []error{err}
	}
	return nil
}

func (t TLS) validate() []error {
	if !t.Enabled {
		if t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != "" {
			return []error{errors.New("kafka.tls.enabled: is false while other kafka.tls settings are set; set it to true to use TLS")}
		}
		return nil
	}
	if _, err := t.Config(); err != nil {
		return []error{err}
	}
	return nil
}

func (s SASL) validate() []error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("kafka.sasl.%s: %s", field, fmt.Sprintf(format, args...)))
	}
	switch s.Mechanism {
	case "":
		if s.Username != "" || s.Password != "" || s.PasswordFile != "" {
			bad("mechanism", "must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 when kafka.sasl credentials are set")
		}
		return errs
	case MechanismPlain, MechanismScramSHA256, MechanismScramSHA512:
	default:
		bad("mechanism", "%q must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (or empty for no SASL)", s.Mechanism)
	}
	if s.Username == "" {
		bad("username", "must not be empty when kafka.sasl.mechanism is set")
	}
	switch {
	case s.Password != "" && s.PasswordFile != "":
		bad("password", "set kafka.sasl.password or kafka.sasl.password_file, not both")
	case s.Password == "" && s.PasswordFile == "":
		bad("password", "must be set (or kafka.sasl.password_file) when kafka.sasl.mechanism is set")
	case s.PasswordFile != "":
		if _, err := s.Secret(); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}
