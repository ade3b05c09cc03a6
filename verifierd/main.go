// Command verifierd is the verification daemon: POST /verify/schema and
// POST /verify/deliverable check a JSON output against a schema and rules,
// have the answer signed by certd (or, with -signer-keys, sign it in process
// with certd's keys) and record it in the verification history;
// GET /reputation/{agent_id} serves that history and GET /score/{agent_id}
// a signed trust score computed from it; /mcp serves the same verification
// and score as the MCP tools verify_schema and get_verification_record.
// It runs behind the gateway (Caddy), which owns payments and allowances.
//
// verifierd copy-history, with the flags of a verifierd moving from its
// Badger history (-data) to a PostgreSQL one (-history), copies the agent
// owners and records into PostgreSQL; verifierd refuses to start on
// PostgreSQL until they are there (history.go).
//
// Every flag can also be set from the environment as VERIFIERD_<FLAG>, with
// dashes as underscores (VERIFIERD_PUBLIC_BASE_URL); a flag on the command
// line wins. The gateway token comes from -gateway-token-file or
// AOV_GATEWAY_TOKEN, never from a flag (flags show up in ps).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/aovhq/aov/internal/buildinfo"
	"github.com/aovhq/aov/internal/flagopt"
	"github.com/aovhq/aov/score"
	"github.com/aovhq/aov/signer"
	"github.com/aovhq/aov/verifierd/server"
	"github.com/aovhq/aov/verify"
	"github.com/aovhq/aov/verify/schema"
)

// version overrides the build's own version when set at build time with
// -ldflags "-X main.version=..."; otherwise the module version or VCS
// commit the toolchain stamped is used (internal/buildinfo).
var version string

type config struct {
	listen, adminListen   string
	dataDir, history      string
	signerSocket          string
	signerKeys            string
	signerURL             string
	signerSecretFile      string
	publicBaseURL         string
	serviceName           string
	gatewayTokenFile      string
	maxBodyBytes          int64
	listCap               int
	verify                verify.Config // the verification budgets
	noSync                bool
	shutdownTimeout       time.Duration
	logLevel              string
	signerTimeout         time.Duration
	readHeaderTimeout     time.Duration
	readTimeout, idleTime time.Duration
	scoreHalfLife         time.Duration
	scoreHorizon          time.Duration
	scoreMaxRecords       int
	scoreUnauthWeight     float64
	devUngatedPaidRoutes  bool
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stderr, nil)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "verifierd:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("verifierd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.listen, "listen", "127.0.0.1:8081", "address of the API (put the gateway in front of it)")
	fs.StringVar(&c.adminListen, "admin-listen", "127.0.0.1:9091", "address of the admin listener (/metrics); empty disables it")
	fs.StringVar(&c.dataDir, "data", "./data/verifierd", "directory of the verification history (Badger)")
	fs.StringVar(&c.history, "history", "", "postgres://… to keep the verification history in PostgreSQL, shared by several verifierd (default: Badger in -data; verifierd copy-history copies that into PostgreSQL)")
	fs.StringVar(&c.signerSocket, "signer-socket", "./data/certd.sock", "certd's signing socket")
	fs.StringVar(&c.signerKeys, "signer-keys", "", "sign in this process with the keys of certd's key directory (one-machine installs where verifierd runs as certd's user; certd still makes, rotates and publishes the keys) instead of asking certd over -signer-socket")
	fs.StringVar(&c.signerURL, "signer-url", "", "certd's loopback signing URL (instead of -signer-socket), e.g. http://127.0.0.1:8091")
	fs.StringVar(&c.signerSecretFile, "signer-secret-file", "", "file holding the bearer secret for -signer-url (mode 0600)")
	fs.StringVar(&c.publicBaseURL, "public-base-url", "http://localhost:8080", "the service's public origin as callers see it (the gateway's)")
	fs.StringVar(&c.serviceName, "service-name", server.DefaultServiceName, "the \"service\" of every receipt's verify block")
	fs.StringVar(&c.gatewayTokenFile, "gateway-token-file", "", "file holding the gateway token that makes X-Aov-* headers trusted (or set AOV_GATEWAY_TOKEN)")
	fs.Int64Var(&c.maxBodyBytes, "max-body-bytes", verify.DefaultMaxBodyBytes, "absolute request body limit; larger bodies get 413 (behind a gate with settle before and validate verify_request, keep it at least 1 MiB: that gate settles a paid body up to 1 MiB before this limit refuses it)")
	fs.IntVar(&c.listCap, "list-cap", verify.DefaultListCap, "entries shown per result list (errors, flags, hints)")
	flagopt.PositiveDuration(fs, &c.verify.Timeout, "verify-timeout", verify.DefaultTimeout, "wall-clock limit of one verification; past it the caller gets 503 verification_timeout")
	fs.IntVar(&c.verify.MaxSchemaSteps, "max-schema-steps", schema.DefaultMaxSteps, "evaluation budget of one verification, in steps (a subschema applied; the work of uniqueItems, const and enum comparisons and of long strings); past it 422")
	fs.Int64Var(&c.verify.MaxRegexWork, "max-regex-work", schema.DefaultMaxRegexWork, "regular-expression budget of one verification, pattern size × string length summed over every match; past it 422")
	fs.Int64Var(&c.verify.MaxIntegrityWork, "max-integrity-work", verify.DefaultMaxIntegrityWork, "work budget of the bounds and rules of one verification (one unit per value a path enters, more for what unique and exists_in compare), counted before they run; past it 422")
	fs.IntVar(&c.verify.MaxPatternSize, "max-pattern-size", schema.DefaultMaxPatternSize, "largest pattern of a schema, in compiled instructions (two class ranges count one); larger ones, and ones whose classes hold more than twice as many ranges, are 422")
	fs.IntVar(&c.verify.MaxSchemas, "max-schemas", schema.DefaultMaxSchemas, "most values of one expected_schema: every value where a subschema belongs (booleans and non-schemas too) and every object in its const, enum, default and examples values, each one more per 256 bytes of its location; more are 422")
	fs.IntVar(&c.verify.MaxConcurrent, "max-concurrent-verifications", 0, "verifications (schema compile and evaluation) running at once (0: twice the CPUs); the others wait within -verify-timeout")
	fs.Int64Var(&c.verify.SchemaCacheBytes, "schema-cache-bytes", schema.DefaultCacheBytes, "memory bound of the compiled-schema cache, in bytes (estimated)")
	fs.BoolVar(&c.noSync, "no-sync", false, "do not fsync each history write (faster; a power loss may drop the last records)")
	flagopt.PositiveDuration(fs, &c.shutdownTimeout, "shutdown-timeout", 30*time.Second, "how long in-flight requests may finish on shutdown")
	fs.DurationVar(&c.scoreHalfLife, "score-half-life", score.DefaultHalfLife, "trust score: age at which a verification counts half")
	fs.DurationVar(&c.scoreHorizon, "score-horizon", score.DefaultHorizon, "trust score: age beyond which a verification is not evidence")
	fs.IntVar(&c.scoreMaxRecords, "score-max-records", score.DefaultMaxRecords, "trust score: newest verifications considered at most (1 to 1000000)")
	fs.Float64Var(&c.scoreUnauthWeight, "score-unauthenticated-weight", score.DefaultUnauthenticatedWeight, "trust score: weight of a verification of an agent_id without an owner (authenticated ones weigh 1; an owned agent's others do not count), in (0, 1]")
	fs.BoolVar(&c.devUngatedPaidRoutes, "dev-ungated-paid-routes", false, "development only: serve the paid routes (GET /score, MCP get_verification_record) to callers without the gateway token, i.e. free to anyone who reaches this listener")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	flagopt.PositiveDuration(fs, &c.signerTimeout, "signer-timeout", 5*time.Second, "timeout of one call to certd")
	flagopt.PositiveDuration(fs, &c.readHeaderTimeout, "read-header-timeout", 5*time.Second, "time allowed to read request headers")
	flagopt.PositiveDuration(fs, &c.readTimeout, "read-timeout", 30*time.Second, "time allowed to read a whole request")
	flagopt.PositiveDuration(fs, &c.idleTime, "idle-timeout", 120*time.Second, "keep-alive idle timeout")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	// Environment fills what the command line did not set.
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || envErr != nil {
			return
		}
		name := "VERIFIERD_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(name); ok {
			if err := fs.Set(f.Name, v); err != nil {
				envErr = fmt.Errorf("%s: %w", name, err)
			}
		}
	})
	return c, envErr
}

// run serves until ctx is cancelled (SIGINT or SIGTERM in main), then stops
// accepting connections and lets in-flight requests finish for up to
// -shutdown-timeout before closing the store. SIGHUP, meanwhile, reloads
// the in-process signer's key directory (reloadKeys). ready, if set, is told the
// bound addresses once both listeners accept (admin is "" when disabled).
func run(ctx context.Context, args []string, stderr io.Writer, ready func(api, admin string)) error {
	if len(args) > 0 && args[0] == "copy-history" {
		return copyHistory(ctx, args[1:], stderr)
	}
	c, log, err := parseConfig(args, stderr)
	if err != nil || log == nil {
		return err
	}

	gwToken, err := gatewayToken(c.gatewayTokenFile)
	if err != nil {
		return err
	}
	if gwToken == "" {
		log.Warn("no gateway token configured: X-Aov-* headers are ignored and every call is recorded with payment \"unknown\"")
	}

	if c.devUngatedPaidRoutes {
		log.Warn("-dev-ungated-paid-routes: the paid routes are served free to anyone who reaches this listener; development only")
	}

	sig, target, err := newSigner(c, log)
	if err != nil {
		return err
	}
	// SIGHUP is what the key store's log advises when signing in process
	// waits for a key (the clock went back behind a retirement), as it
	// is certd's: installed before anything is served, so it never takes
	// the signal's default action, which ends the process mid-request.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	db, err := openHistory(ctx, c, log)
	if err != nil {
		return err
	}
	defer func() {
		if err := db.Close(); err != nil {
			log.Error("closing store", "error", err)
		}
	}()

	// Zero means "default" to score.New; on the command line it is a
	// mistake (a weight of 0 would not ignore unauthenticated evidence).
	if c.scoreUnauthWeight <= 0 || c.scoreHalfLife <= 0 || c.scoreHorizon <= 0 || c.scoreMaxRecords <= 0 {
		return errors.New("the -score-* settings must be positive (and the unauthenticated weight at most 1)")
	}
	scoreMethod, err := score.New(score.Config{
		HalfLife: c.scoreHalfLife, Horizon: c.scoreHorizon,
		MaxRecords: c.scoreMaxRecords, UnauthenticatedWeight: c.scoreUnauthWeight,
	})
	if err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics, err := server.NewMetrics(reg)
	if err != nil {
		return fmt.Errorf("registering metrics: %w", err)
	}

	h, err := server.New(server.Config{
		Verifier:          verify.New(verifyConfig(c)),
		Signer:            sig,
		History:           db,
		PublicBaseURL:     c.publicBaseURL,
		ServiceName:       c.serviceName,
		GatewayToken:      gwToken,
		Score:             scoreMethod,
		UngatedPaidRoutes: c.devUngatedPaidRoutes,
		Logger:            log,
		Metrics:           metrics,
	})
	if err != nil {
		return err
	}

	api := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: c.readHeaderTimeout,
		ReadTimeout:       c.readTimeout,
		IdleTimeout:       c.idleTime,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	ln, err := net.Listen("tcp", c.listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", c.listen, err)
	}
	servers := []*http.Server{api}
	errc := make(chan error, 2)
	go func() { errc <- api.Serve(ln) }()
	log.Info("verifierd listening", "addr", ln.Addr().String(), "version", buildinfo.Version(version), "data", c.dataDir,
		"public_base_url", c.publicBaseURL, "signer", target)

	adminAddr := ""
	if c.adminListen != "" {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		admin := &http.Server{Handler: mux, ReadHeaderTimeout: c.readHeaderTimeout}
		aln, err := net.Listen("tcp", c.adminListen)
		if err != nil {
			api.Close()
			return fmt.Errorf("listening on admin address %s: %w", c.adminListen, err)
		}
		servers = append(servers, admin)
		go func() { errc <- admin.Serve(aln) }()
		log.Info("admin listener (metrics)", "addr", aln.Addr().String())
		adminAddr = aln.Addr().String()
	}
	if ready != nil {
		ready(ln.Addr().String(), adminAddr)
	}

serve:
	for {
		select {
		case <-ctx.Done():
			log.Info("shutting down: finishing in-flight requests", "timeout", c.shutdownTimeout.String())
			break serve
		case err := <-errc:
			if !errors.Is(err, http.ErrServerClosed) {
				log.Error("listener failed", "error", err)
			}
			break serve
		case <-hup:
			reloadKeys(sig, target, log)
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), c.shutdownTimeout)
	defer cancel()
	var firstErr error
	for _, s := range servers {
		if err := s.Shutdown(sctx); err != nil && firstErr == nil {
			firstErr = fmt.Errorf("shutting down: %w", err)
		}
	}
	return firstErr
}

// reloadKeys answers a SIGHUP: the in-process signer re-reads certd's key
// directory at once, as certd does on SIGHUP; certd as the signer holds
// the keys itself, so there is nothing to reload here, and the log says so
// rather than leave the operator guessing. Neither ever stops verifierd.
func reloadKeys(sig server.Signer, target string, log *slog.Logger) {
	l, ok := sig.(*signer.Local)
	if !ok {
		log.Info("SIGHUP: nothing to reload, certd holds the keys", "signer", target)
		return
	}
	current, versions, err := l.Reload()
	if err != nil {
		log.Error("reloading keys on SIGHUP failed; not signing until the key directory loads", "error", err)
		return
	}
	log.Info("keys reloaded on SIGHUP", "current_key_version", current, "key_versions", versions)
}

// parseConfig reads the flags and environment and makes the log they
// ask for. After -h it returns neither a log nor an error.
func parseConfig(args []string, stderr io.Writer) (config, *slog.Logger, error) {
	c, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return c, nil, nil
		}
		return c, nil, err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.logLevel)); err != nil {
		return c, nil, fmt.Errorf("log level: %w", err)
	}
	return c, slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level})), nil
}

// verifyConfig is the verifier's configuration from the flags.
func verifyConfig(c config) verify.Config {
	vc := c.verify
	vc.MaxBodyBytes, vc.ListCap, vc.VerifierVersion = c.maxBodyBytes, c.listCap, buildinfo.Version(version)
	return vc
}

// gatewayToken reads the token from file (which must not be readable by
// others, like the signer secret) or from AOV_GATEWAY_TOKEN.
func gatewayToken(file string) (string, error) {
	if file != "" {
		tok, err := signer.ReadSecretFile(file)
		if err != nil {
			return "", fmt.Errorf("gateway token: %w", err)
		}
		return tok, nil
	}
	tok := strings.TrimSpace(os.Getenv("AOV_GATEWAY_TOKEN"))
	if tok != "" && len(tok) < signer.MinSecretBytes {
		return "", fmt.Errorf("gateway token: AOV_GATEWAY_TOKEN holds %d bytes, want at least %d", len(tok), signer.MinSecretBytes)
	}
	return tok, nil
}

func hostPort(rawURL string) string {
	s := strings.TrimPrefix(strings.TrimPrefix(rawURL, "http://"), "https://")
	if i := strings.IndexByte(s, '/'); i >= 0 {
		s = s[:i]
	}
	return s
}

// newSigner is the signer the flags name and how to describe it in the
// log: in process with certd's keys (-signer-keys), or certd over its
// loopback URL or (the default) its unix socket.
func newSigner(c config, log *slog.Logger) (server.Signer, string, error) {
	if c.signerKeys != "" {
		if c.signerURL != "" {
			return nil, "", errors.New("-signer-keys and -signer-url are two signers: choose one")
		}
		l, err := signer.NewLocal(c.signerKeys, log)
		if err != nil {
			return nil, "", err
		}
		return l, "in process, keys in " + c.signerKeys, nil
	}
	sc := signer.ClientConfig{Timeout: c.signerTimeout}
	if c.signerURL == "" {
		sc.Socket = c.signerSocket
		return signer.NewClient(sc), "unix:" + sc.Socket, nil
	}
	if err := signer.CheckLoopback(hostPort(c.signerURL)); err != nil {
		return nil, "", err
	}
	if c.signerSecretFile == "" {
		return nil, "", errors.New("-signer-url needs -signer-secret-file")
	}
	var err error
	if sc.Secret, err = signer.ReadSecretFile(c.signerSecretFile); err != nil {
		return nil, "", err
	}
	sc.URL = c.signerURL
	return signer.NewClient(sc), sc.URL, nil
}
