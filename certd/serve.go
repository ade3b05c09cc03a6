package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/aovhq/aov/agentcard"
	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/internal/buildinfo"
	"github.com/aovhq/aov/internal/flagopt"
	"github.com/aovhq/aov/keystore"
	"github.com/aovhq/aov/signer"
)

// version overrides the agent card's version when set at build time with
// -ldflags "-X main.version=..."; otherwise the build's own module version
// or VCS commit is used (internal/buildinfo).
var version string

// serveConfig is everything `certd serve` is told.
type serveConfig struct {
	keysDir        string
	dev            bool
	signSocket     string
	signListen     string
	signSecretFile string
	publicListen   string
	publicBaseURL  string
	serviceName    string
	providerOrg    string
	providerURL    string
	maxSkew        time.Duration
	logLevel       string
}

func parseServe(args []string, stderr io.Writer) (serveConfig, error) {
	var c serveConfig
	fs := newFlags("serve", stderr)
	fs.StringVar(&c.keysDir, "keys", env("CERTD_KEYS", defaultKeysDir), "key directory (env CERTD_KEYS)")
	fs.BoolVar(&c.dev, "dev", envBool("CERTD_DEV"), "development mode: generate a first key when the key directory is empty (env CERTD_DEV=1)")
	fs.StringVar(&c.signSocket, "sign-socket", env("CERTD_SIGN_SOCKET", "./data/certd.sock"), "unix socket of the signing endpoint, mode 0600 (env CERTD_SIGN_SOCKET)")
	fs.StringVar(&c.signListen, "sign-listen", env("CERTD_SIGN_LISTEN", ""), "serve the signing endpoint on this loopback TCP address instead of the socket, e.g. 127.0.0.1:8091; needs -sign-secret-file (env CERTD_SIGN_LISTEN)")
	fs.StringVar(&c.signSecretFile, "sign-secret-file", env("CERTD_SIGN_SECRET_FILE", ""), "file holding the bearer secret of -sign-listen, mode 0600 (env CERTD_SIGN_SECRET_FILE)")
	fs.StringVar(&c.publicListen, "public-listen", env("CERTD_PUBLIC_LISTEN", "127.0.0.1:8082"), "address of the public endpoint: agent card and /health (env CERTD_PUBLIC_LISTEN)")
	fs.StringVar(&c.publicBaseURL, "public-base-url", env("CERTD_PUBLIC_BASE_URL", "http://localhost:8080"), "public base URL of the service, as clients reach it through the gateway (env CERTD_PUBLIC_BASE_URL)")
	fs.StringVar(&c.serviceName, "service-name", env("CERTD_SERVICE_NAME", agentcard.DefaultName), "service name in the agent card (env CERTD_SERVICE_NAME)")
	fs.StringVar(&c.providerOrg, "provider-org", env("CERTD_PROVIDER_ORG", ""), "organisation named as provider in the agent card (env CERTD_PROVIDER_ORG)")
	fs.StringVar(&c.providerURL, "provider-url", env("CERTD_PROVIDER_URL", ""), "provider URL in the agent card (env CERTD_PROVIDER_URL)")
	flagopt.PositiveDuration(fs, &c.maxSkew, "max-skew", signer.DefaultMaxSkew, "how far a sign request's attested_at may be from this clock (env CERTD_MAX_SKEW)")
	fs.StringVar(&c.logLevel, "log-level", env("CERTD_LOG_LEVEL", "info"), "debug, info, warn or error (env CERTD_LOG_LEVEL)")
	if err := parse(fs, args); err != nil {
		return c, err
	}
	// The variable is read as the flag is, so a typo in it is refused like
	// one on the command line, never replaced by the default.
	if v, ok := os.LookupEnv("CERTD_MAX_SKEW"); ok && !flagSet(fs, "max-skew") {
		if err := fs.Set("max-skew", v); err != nil {
			return c, usagef("CERTD_MAX_SKEW=%q: %v", v, err)
		}
	}
	if c.signListen != "" && c.signSecretFile == "" {
		return c, usagef("-sign-listen needs -sign-secret-file: on TCP the bearer secret is the only authentication")
	}
	if c.signListen != "" {
		// Checked before anything else happens (a dev key generated for
		// a start that then fails would be a surprise).
		if err := signer.CheckLoopback(c.signListen); err != nil {
			return c, err
		}
	}
	if c.signListen == "" && c.signSocket == "" {
		return c, usagef("give -sign-socket or -sign-listen")
	}
	if c.publicBaseURL == "" {
		return c, usagef("-public-base-url is required")
	}
	return c, nil
}

// serve runs the daemon until SIGINT or SIGTERM.
func serve(args []string, stderr io.Writer) error {
	cfg, err := parseServe(args, stderr)
	if err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.logLevel)); err != nil {
		return usagef("-log-level %q: use debug, info, warn or error", cfg.logLevel)
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level})).With("service", "certd")

	keys, err := openKeys(cfg, log)
	if err != nil {
		return err
	}
	defer keys.Close()

	// Signing endpoint: private.
	var secret string
	var signLn net.Listener
	if cfg.signListen != "" {
		if secret, err = signer.ReadSecretFile(cfg.signSecretFile); err != nil {
			return err
		}
		signLn, err = signer.ListenTCP(cfg.signListen)
	} else {
		signLn, err = signer.ListenUnix(cfg.signSocket)
	}
	if err != nil {
		return err
	}
	signSrv, err := signer.NewServer(signer.ServerConfig{Keys: keys, MaxSkew: cfg.maxSkew, Secret: secret, Logger: log.With("endpoint", "sign")})
	if err != nil {
		signLn.Close()
		return err
	}

	// Public endpoint: agent card and health.
	var provider *agentcard.Provider
	if cfg.providerOrg != "" {
		provider = &agentcard.Provider{Organization: cfg.providerOrg, URL: cfg.providerURL}
	}
	card, err := agentcard.NewHandler(agentcard.Config{
		Name:     cfg.serviceName,
		BaseURL:  cfg.publicBaseURL,
		Version:  buildinfo.Version(version),
		Provider: provider,
	}, keys, 0, log.With("endpoint", "public"))
	if err != nil {
		signLn.Close()
		return err
	}
	pubLn, err := net.Listen("tcp", cfg.publicListen)
	if err != nil {
		signLn.Close()
		return fmt.Errorf("listening on %s: %w", cfg.publicListen, err)
	}

	servers := []*http.Server{
		newHTTPServer(signSrv, log),
		newHTTPServer(publicMux(card, http.HandlerFunc(signSrv.ServeHealth)), log),
	}
	errc := make(chan error, 2)
	for i, ln := range []net.Listener{signLn, pubLn} {
		go func() {
			if err := servers[i].Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		}()
	}
	cur, _ := keys.Current()
	log.Info("certd ready",
		"sign_addr", signLn.Addr().String(), "sign_transport", signLn.Addr().Network(),
		"public_addr", pubLn.Addr().String(), "public_base_url", cfg.publicBaseURL,
		"current_key_version", cur.Version, "key_versions", len(keys.List()), "version", buildinfo.Version(version))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	var runErr error
loop:
	for {
		select {
		case <-ctx.Done():
			log.Info("shutting down")
			break loop
		case err := <-errc:
			runErr = fmt.Errorf("serving: %w", err)
			log.Error("server failed; shutting down", "error", err)
			break loop
		case <-hup:
			if err := keys.Reload(); err != nil {
				log.Error("reloading keys on SIGHUP failed; not signing until the key directory loads", "error", err)
				continue
			}
			cur, _ := keys.Current()
			log.Info("keys reloaded on SIGHUP", "current_key_version", cur.Version, "key_versions", len(keys.List()))
		}
	}
	shutCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, s := range servers {
		if err := s.Shutdown(shutCtx); err != nil {
			log.Warn("shutdown did not finish cleanly", "error", err)
		}
	}
	log.Info("stopped")
	return runErr
}

// openKeys opens the key directory; in dev mode an empty one gets its first
// key. Outside dev mode an empty directory is refused: a production key is
// made deliberately, with `certd rotate`.
func openKeys(cfg serveConfig, log *slog.Logger) (*keystore.Store, error) {
	// As a signer (keystore.OpenSigner, which `certd keys` shares): every
	// signature checks the index for a rotation by `certd rotate` or
	// `certd compromise` (other processes), and the kernel's report of a
	// change makes that check free when there was none. certd holds the
	// private keys that may still sign alone, so none retired that a
	// takeover of the process could sign with (receipts dated within a
	// retired key's service life still verify).
	keys, err := keystore.OpenSigner(cfg.keysDir, nil)
	if err != nil {
		return nil, err
	}
	_, err = keys.Current()
	if errors.Is(err, keystore.ErrNoKey) && len(keys.List()) == 0 {
		if !cfg.dev {
			keys.Close()
			return nil, fmt.Errorf("no signing key in %s: create one with `certd rotate -keys %s` (or start with -dev to generate a development key)", cfg.keysDir, cfg.keysDir)
		}
		k, err := keys.Generate()
		if err != nil {
			keys.Close()
			return nil, err
		}
		log.Warn("generated a development signing key; for production create keys with `certd rotate` and keep the key directory private", "key_version", k.Version, "keys_dir", cfg.keysDir)
		return keys, nil
	}
	if err != nil && keys.StateChanged(err) {
		// The history is readable but no key is usable: a key file that
		// does not load (keystore.KeyFileError: a `sudo certd compromise`
		// left the new key root's or 0644), a key file newer than the
		// index (keystore.NewerKeyFilesError), a compromise whose
		// replacement was refused, a new key not in service yet by this
		// clock. certd serves the card of the history the index holds
		// (verifiers need its compromise marks most of all) and signs
		// nothing (503) until a key is in service. Said at start, with
		// the fix, not only on the first signature.
		log.Error("not signing until a key is in service; the agent card is served", "error", err)
	}
	return keys, nil
}

func newHTTPServer(h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// publicMux routes the public endpoint: the agent card and a liveness check.
// It is what the gateway proxies /.well-known/agent-card.json to; the
// signing endpoint is a different listener and never routed here. health
// is the signing listener's own /health (signer.Server.ServeHealth): one
// answer, refreshed from the key directory like the card, on both.
func publicMux(card, health http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/.well-known/agent-card.json":
			card.ServeHTTP(w, r)
		case "/health":
			health.ServeHTTP(w, r)
		default:
			apierr.Write(w, apierr.NotFound("resource"))
		}
	})
}
