package keystore

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aovhq/aov/receipt"
)

// privates lists the versions whose private key s holds.
func privates(s *Store) string {
	var out []string
	for _, k := range s.List() {
		if k.Private != nil {
			out = append(out, k.Version)
		}
	}
	return strings.Join(out, ",")
}

// A rotation run on a clock ahead of the signing process's (another host
// on a shared key directory) publishes a key whose created_at is still in
// this clock's future. The key before it stays in service until its
// retired_at arrives by this clock, then the new one takes over, and the
// retired private key is forgotten: no receipt is ever dated before its
// key's created_at.
func TestARotationOnAClockAheadTakesEffectWhenItsTimeComes(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	ahead := &clock{t: c.Now().Add(10 * time.Minute)}
	if _, err := open(t, dir, c).Generate(); err != nil {
		t.Fatal(err)
	}
	serving := serve(t, dir, c)
	c.Add(time.Minute)
	ahead.Add(time.Minute)
	if _, err := open(t, dir, ahead).Rotate(); err != nil {
		t.Fatal(err)
	}
	if changed, err := serving.Refresh(); err != nil || !changed {
		t.Fatalf("Refresh = %v, %v", changed, err)
	}
	if cur, err := serving.Current(); err != nil || cur.Version != "k1" || cur.Private == nil {
		t.Fatalf("Current with k2 created 10 min ahead of this clock = %s (private %v), %v; want k1", cur.Version, cur.Private != nil, err)
	}
	if got := privates(serving); got != "k1,k2" {
		t.Fatalf("private keys held while k1 is retired in this clock's future: %q", got)
	}
	c.Add(10*time.Minute - time.Microsecond)
	if cur, err := serving.Current(); err != nil || cur.Version != "k1" {
		t.Fatalf("Current a microsecond before k1's retired_at = %s, %v; want k1", cur.Version, err)
	}
	c.Add(time.Microsecond)
	if cur, err := serving.Current(); err != nil || cur.Version != "k2" || cur.Private == nil {
		t.Fatalf("Current at k2's created_at = %s, %v; want k2", cur.Version, err)
	}
	if got := privates(serving); got != "k2" {
		t.Fatalf("private keys held once k1's retirement came: %q, want k2", got)
	}
}

// A compromise of the current key marked on a clock ahead retires it there
// and creates its replacement there: by this clock no key's window holds
// now. Signing stops, with an error naming the clock difference, and
// resumes by itself when the new key's created_at arrives.
func TestNoKeyInServiceByThisClockSignsNothingUntilOneIs(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	ahead := &clock{t: c.Now().Add(10 * time.Minute)}
	if _, err := open(t, dir, c).Generate(); err != nil {
		t.Fatal(err)
	}
	serving := serve(t, dir, c)
	if _, err := open(t, dir, ahead).MarkCompromised("k1", c.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := serving.Refresh(); err != nil {
		t.Fatal(err)
	}
	_, err := serving.Current()
	var ns *NotInServiceError
	if !errors.As(err, &ns) || ns.Version != "k2" {
		t.Fatalf("Current = %v; want a NotInServiceError for k2", err)
	}
	if !strings.Contains(err.Error(), "10m0s ahead of this clock") {
		t.Errorf("the refusal %q does not name the clock difference", err)
	}
	c.Add(10 * time.Minute)
	if cur, err := serving.Current(); err != nil || cur.Version != "k2" {
		t.Fatalf("Current at k2's created_at = %s, %v; want k2", cur.Version, err)
	}
}

// A rotation run on a clock behind would retire the key before receipts
// the process already signed with it, which verifiers would then refuse.
// The process refuses that index like any history it must not take (it
// signs nothing, the history stays), naming the clock difference; a
// retirement that leaves every receipt inside the key's widened window
// loads, and a compromise mark, which may mean to distrust receipts, is
// never refused for it.
func TestARetirementBeforeASignedReceiptIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name    string
		behind  time.Duration
		change  func(*Store) error
		refused bool
	}{
		{"rotate 10 min behind", 10 * time.Minute, func(s *Store) error { _, err := s.Rotate(); return err }, true},
		{"rotate within the skew", receipt.MaxSigningSkew - time.Second, func(s *Store) error { _, err := s.Rotate(); return err }, false},
		{"compromise 10 min behind", 10 * time.Minute, func(s *Store) error {
			_, err := s.MarkCompromised("k1", s.now().Add(-time.Hour))
			return err
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			c := newClock()
			if _, err := open(t, dir, c).Generate(); err != nil {
				t.Fatal(err)
			}
			c.Add(time.Hour)
			serving := serve(t, dir, c)
			if _, err := serving.Choose("k1", c.Now()); err != nil {
				t.Fatal(err)
			}
			if err := tc.change(open(t, dir, &clock{t: c.Now().Add(-tc.behind)})); err != nil {
				t.Fatal(err)
			}
			_, err := serving.Refresh()
			if !tc.refused {
				if err != nil {
					t.Fatalf("Refresh: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Refresh loaded a retirement 10 min before a receipt the process signed")
			}
			for _, want := range []string{"retires key k1", "10m0s before the newest receipt", "reads behind the one that dated those receipts", "restart"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the refusal %q does not say %q", err, want)
				}
			}
			if _, err := serving.Current(); err == nil {
				t.Fatal("Current signs after a refused index")
			}
			if got := versions(serving.List()); got != "k1:current" {
				t.Fatalf("List = %s, want the history loaded before", got)
			}
		})
	}
}

// Statuses describes the keys by the rule that picks the key that signs:
// after a rotation dated ahead, the key in service is current and the new
// one pending until its time comes; with no key in service (the current
// key marked compromised, its replacement dated ahead) none is current.
func TestStatusesFollowTheKeyInService(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	ahead := &clock{t: c.Now().Add(10 * time.Minute)}
	if _, err := open(t, dir, c).Generate(); err != nil {
		t.Fatal(err)
	}
	serving := serve(t, dir, c)
	if _, err := open(t, dir, ahead).Rotate(); err != nil {
		t.Fatal(err)
	}
	if _, err := serving.Refresh(); err != nil {
		t.Fatal(err)
	}
	status := func() string {
		keys := serving.List()
		var out []string
		for i, st := range serving.Statuses(keys) {
			out = append(out, keys[i].Version+":"+st)
		}
		return strings.Join(out, ",")
	}
	for _, step := range []struct {
		to   time.Time
		want string
	}{
		{c.Now(), "k1:current,k2:pending"},
		{ahead.Now().Add(-time.Microsecond), "k1:current,k2:pending"},
		{ahead.Now(), "k1:retired,k2:current"},
	} {
		c.t = step.to
		k, err := serving.Current()
		if got := status(); got != step.want || err != nil || !strings.Contains(step.want, k.Version+":current") {
			t.Fatalf("at %s: statuses %s, signing with %q (%v); want %s", formatTime(step.to), got, k.Version, err, step.want)
		}
	}
	ahead.Add(10 * time.Minute)
	if _, err := open(t, dir, ahead).MarkCompromised("k2", c.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := serving.Refresh(); err != nil {
		t.Fatal(err)
	}
	if _, err := serving.Current(); err == nil {
		t.Fatal("signing with no key in service")
	}
	if got := status(); got != "k1:retired,k2:compromised,k3:pending" {
		t.Fatalf("with no key in service: %s", got)
	}
}

// status is how s describes its keys (Store.Statuses), as "k1:retired,...".
func status(s *Store) string {
	keys := s.List()
	var out []string
	for i, st := range s.Statuses(keys) {
		out = append(out, keys[i].Version+":"+st)
	}
	return strings.Join(out, ",")
}

// While a store signs nothing, no key is current: the card and `certd
// keys` must not name as current a key certd cannot sign with. The key in
// service by the history is pending until it signs. Causes: its private
// key file does not load, a pending key's file does not (a signer loads
// every key that may still sign), key files newer than the index (each
// seen alike by the running signer and by `certd keys`, which opens the
// directory as a signer starting now), and a clock that went back behind
// a retirement, before a reload loads the key again (only the running
// signer knows it forgot the key).
func TestNoKeyIsCurrentWhileNoneSigns(t *testing.T) {
	t.Run("key file does not load", func(t *testing.T) {
		dir := t.TempDir()
		c := newClock()
		if _, err := open(t, dir, c).Generate(); err != nil {
			t.Fatal(err)
		}
		serving := serve(t, dir, c)
		c.Add(time.Hour)
		if _, err := open(t, dir, c).MarkCompromised("k1", c.Now().Add(-time.Minute)); err != nil {
			t.Fatal(err)
		}
		k2 := filepath.Join(dir, "k2.key")
		if err := os.Chmod(k2, 0o644); err != nil {
			t.Fatal(err)
		}
		serving.Refresh()
		if _, err := serving.Current(); err == nil {
			t.Fatal("signing with k2.key unloadable")
		}
		for name, s := range map[string]*Store{"signing store": serving, "certd keys": serve(t, dir, c)} {
			if got := status(s); got != "k1:compromised,k2:pending" {
				t.Errorf("%s while k2.key does not load: %s; want k1:compromised,k2:pending", name, got)
			}
		}
		if err := os.Chmod(k2, 0o600); err != nil {
			t.Fatal(err)
		}
		serving.Refresh()
		for name, s := range map[string]*Store{"signing store": serving, "certd keys": serve(t, dir, c)} {
			if got := status(s); got != "k1:compromised,k2:current" {
				t.Errorf("%s once k2.key loads: %s; want k1:compromised,k2:current", name, got)
			}
		}
	})
	t.Run("a pending key's file does not load", func(t *testing.T) {
		dir := t.TempDir()
		c := newClock()
		if _, err := open(t, dir, c).Generate(); err != nil {
			t.Fatal(err)
		}
		serving := serve(t, dir, c)
		c.Add(time.Minute)
		if _, err := open(t, dir, &clock{t: c.Now().Add(10 * time.Minute)}).Rotate(); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(dir, "k2.key"), 0o644); err != nil {
			t.Fatal(err)
		}
		serving.Refresh()
		if _, err := serving.Current(); err == nil {
			t.Fatal("signing with k2.key unloadable")
		}
		for name, s := range map[string]*Store{"signing store": serving, "certd keys": serve(t, dir, c)} {
			if got := status(s); got != "k1:pending,k2:pending" {
				t.Errorf("%s while k2.key does not load: %s; want k1:pending,k2:pending", name, got)
			}
		}
	})
	t.Run("key files newer than the index", func(t *testing.T) {
		dir := t.TempDir()
		c := newClock()
		operator := open(t, dir, c)
		if _, err := operator.Generate(); err != nil {
			t.Fatal(err)
		}
		backup, err := os.ReadFile(filepath.Join(dir, IndexFile))
		if err != nil {
			t.Fatal(err)
		}
		c.Add(time.Hour)
		if _, err := operator.Rotate(); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, IndexFile), backup, 0o644); err != nil {
			t.Fatal(err)
		}
		serving := serve(t, dir, c)
		if _, err := serving.Current(); err == nil {
			t.Fatal("signing with k2.key newer than the index")
		}
		for name, s := range map[string]*Store{"signing store": serving, "certd keys": serve(t, dir, c)} {
			if got := status(s); got != "k1:pending" {
				t.Errorf("%s with k2.key newer than the index: %s; want k1:pending", name, got)
			}
		}
	})
	t.Run("clock went back", func(t *testing.T) {
		dir := t.TempDir()
		c := newClock()
		if _, err := open(t, dir, c).Generate(); err != nil {
			t.Fatal(err)
		}
		serving := serve(t, dir, c)
		c.Add(time.Minute)
		k2, err := open(t, dir, c).Rotate()
		if err != nil {
			t.Fatal(err)
		}
		c.Add(time.Second)
		serving.Refresh()
		if k, err := serving.Current(); err != nil || k.Version != "k2" {
			t.Fatalf("after the rotation: %s %v", k.Version, err)
		}
		c.t = k2.CreatedAt.Add(-30 * time.Second) // the step back
		if _, err := serving.Current(); err == nil {
			t.Fatal("signing after the clock went back behind k1's forgotten retirement")
		}
		if got := status(serving); got != "k1:pending,k2:pending" {
			t.Errorf("while nothing signs after the step back: %s; want k1:pending,k2:pending", got)
		}
		// `certd keys` says what a signer started now does: it loads k1
		// and signs with it. Only the running one knows it forgot k1.
		if got := status(serve(t, dir, c)); got != "k1:current,k2:pending" {
			t.Errorf("a signer opened after the step back: %s; want k1:current,k2:pending", got)
		}
		if err := serving.Reload(); err != nil {
			t.Fatal(err)
		}
		if got := status(serving); got != "k1:current,k2:pending" {
			t.Errorf("after a reload: %s; want k1:current,k2:pending", got)
		}
	})
}

// Two signatures at the switch instant of a rotation dated ahead: B reads
// the clock a microsecond before k1's retired_at, A a microsecond after,
// chooses k2 and drops k1's private key (CurrentOnly). Whatever the
// interleaving, B must sign with the key in service by its reading, never
// find that key forgotten and answer "the clock went back" (no clock went
// back: the readings are in order). The clock below is scripted so that B
// is held inside its reading while A runs; it lets B go after A is done,
// or after a moment if A cannot finish while B reads.
func TestASignatureAtTheSwitchInstantNeverFindsItsKeyForgotten(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	ahead := &clock{t: c.Now().Add(10 * time.Minute)}
	if _, err := open(t, dir, c).Generate(); err != nil {
		t.Fatal(err)
	}
	var (
		mu     sync.Mutex
		script []func() time.Time
	)
	now := func() time.Time {
		mu.Lock()
		if len(script) > 0 {
			f := script[0]
			script = script[1:]
			mu.Unlock()
			return f()
		}
		mu.Unlock()
		return c.Now()
	}
	serving, err := Open(dir, Options{Now: now, CurrentOnly: true, Watch: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { serving.Close() })
	c.Add(time.Minute)
	ahead.Add(time.Minute)
	k2, err := open(t, dir, ahead).Rotate()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := serving.Refresh(); err != nil {
		t.Fatal(err)
	}
	R := k2.CreatedAt // k1's retired_at
	bReading, aDone := make(chan struct{}), make(chan struct{})
	mu.Lock()
	script = []func() time.Time{
		func() time.Time { // B's reading
			close(bReading)
			select {
			case <-aDone:
			case <-time.After(300 * time.Millisecond):
			}
			return R.Add(-time.Microsecond)
		},
		func() time.Time { return R.Add(time.Microsecond) }, // A's
	}
	mu.Unlock()
	type chosen struct {
		k   Key
		err error
	}
	b := make(chan chosen, 1)
	go func() {
		k, err := serving.Choose("k1", R.Add(-time.Microsecond))
		b <- chosen{k, err}
	}()
	<-bReading
	a := make(chan chosen, 1)
	go func() {
		k, err := serving.Choose("k2", R.Add(time.Microsecond))
		a <- chosen{k, err}
		close(aDone)
	}()
	for name, ch := range map[string]chan chosen{"B (clock before k1's retired_at)": b, "A (clock after it)": a} {
		select {
		case got := <-ch:
			want := map[bool]string{true: "k1", false: "k2"}[ch == b]
			if got.err != nil || got.k.Version != want || got.k.Private == nil {
				t.Errorf("%s chose %s (private %v), %v; want %s", name, got.k.Version, got.k.Private != nil, got.err, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s has not chosen after 5 s", name)
		}
	}
}

// certd's clock ran 10 min ahead while it signed with k1, then NTP
// stepped it back, and the operator ran `certd rotate` on certd's own
// host: a correct clock, whose retirement of k1 is dated before receipts
// certd delivered. Loading it would make them fail verification, so it is
// refused, for as long as the process runs; the refusal says so without
// blaming another host or naming an index to put back, and its two ways
// out work: an index that retires k1 at or after its newest receipt loads
// on the next request (k1 signs until then, k2 after), and a restart
// accepts the index as it is.
func TestARotationAfterThisHostsClockWasCorrectedSaysHowToResolveIt(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	if _, err := open(t, dir, c).Generate(); err != nil {
		t.Fatal(err)
	}
	c.Add(time.Hour + 10*time.Minute) // certd's clock, 10 min ahead
	serving := serve(t, dir, c)
	X := c.Now()
	if _, err := serving.Choose("k1", X); err != nil {
		t.Fatal(err)
	}
	c.Add(-10 * time.Minute) // NTP steps it back
	c.Add(time.Minute)
	if _, err := open(t, dir, c).Rotate(); err != nil { // on the same, corrected clock
		t.Fatal(err)
	}
	_, err := serving.Refresh()
	if err == nil {
		t.Fatal("a retirement 9 min before a delivered receipt loaded")
	}
	msg := err.Error()
	for _, want := range []string{
		"dated " + formatTime(X),
		"this host's clock ahead when it signed them and corrected since",
		"set the retired_at of key k1, and the created_at of the key after it, to " + formatTime(X) + " or later",
		"restart the process",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("the refusal does not say %q: %s", want, msg)
		}
	}
	for _, wrong := range []string{"put the newest index back", "correct it with NTP"} {
		if strings.Contains(msg, wrong) {
			t.Errorf("the refusal says %q, which does not apply: %s", wrong, msg)
		}
	}
	c.Add(time.Minute)
	if _, err := serving.Refresh(); err == nil {
		t.Fatal("the refusal lifted by itself")
	}

	// A restart accepts the index as it is.
	restarted := serve(t, dir, c)
	if k, err := restarted.Current(); err != nil || k.Version != "k2" {
		t.Errorf("after a restart: %s %v; want k2", k.Version, err)
	}

	// The running process loads an index retiring k1 at its newest receipt.
	rewriteIndex(t, dir, func(idx *index) {
		idx.Keys[0].RetiredAt = formatTime(X)
		idx.Keys[1].CreatedAt = formatTime(X)
	})
	if _, err := serving.Refresh(); err != nil {
		t.Fatalf("the index edited as the refusal says: %v", err)
	}
	if k, err := serving.Current(); err != nil || k.Version != "k1" {
		t.Errorf("before %s: %s %v; want k1", formatTime(X), k.Version, err)
	}
	c.t = X
	if k, err := serving.Current(); err != nil || k.Version != "k2" {
		t.Errorf("at %s: %s %v; want k2", formatTime(X), k.Version, err)
	}
}
