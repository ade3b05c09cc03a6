package pghistory

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/store"
)

// An agent id over the contract's limit is refused by the store's own
// check, with the error the embedded store gives, before PostgreSQL sees
// it. (Before: the contract took ids up to 65535 bytes, and an
// incompressible one over btree's entry limit, about 2.7 kB, failed in
// PostgreSQL's index on agent_id, which the embedded store recorded.)
func TestAgentIDOverTheLimitRefusedLikeTheEmbeddedStore(t *testing.T) {
	srv := servers.StartPostgres(t)
	h := open(t, freshDB(t, srv))
	ctx := context.Background()
	b := make([]byte, 2000)
	rand.Read(b)
	agent := hex.EncodeToString(b) // 4000 bytes
	v := store.Verification{ID: "long-1", VerifiedAt: time.Now(), Result: "pass", AgentID: agent,
		OutputHash: hex.EncodeToString(b[:32]), SchemaHash: hex.EncodeToString(b[:32]), RulesHash: hex.EncodeToString(b[:32]), RequestHash: hex.EncodeToString(b[:32])}
	db, err := store.Open(t.TempDir(), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	embedded := db.RecordVerification(ctx, v)
	err = h.RecordVerification(ctx, v)
	if err == nil || embedded == nil || err.Error() != embedded.Error() {
		t.Errorf("RecordVerification of a %d-byte agent id: %v; embedded store: %v; want the same refusal", len(agent), err, embedded)
	}
	_, embedded = db.BindAgent(ctx, agent, "0x1111111111111111111111111111111111111111")
	_, err = h.BindAgent(ctx, agent, "0x1111111111111111111111111111111111111111")
	if err == nil || embedded == nil || err.Error() != embedded.Error() || strings.Contains(err.Error(), "index") {
		t.Errorf("BindAgent of a %d-byte agent id: %v; embedded store: %v; want the same refusal", len(agent), err, embedded)
	}
}
