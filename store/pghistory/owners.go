package pghistory

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Bounds of an owner record, as the embedded store keeps them.
const (
	maxAgentID = 1<<16 - 1
	maxOwner   = 128
)

// BindAgent makes wallet the owner of agentID unless it already has one
// and returns the owner afterwards; of concurrent first binders on any
// instances exactly one wins and the others get its address. verifierd
// uses it (when the history offers it) before it counts a verification of
// an agent id that is not itself a wallet as authenticated.
func (h *History) BindAgent(ctx context.Context, agentID, wallet string) (string, error) {
	if agentID == "" || len(agentID) > maxAgentID {
		return "", errors.New("store: agent id must be 1..65535 bytes")
	}
	if wallet == "" || len(wallet) > maxOwner {
		return "", fmt.Errorf("store: owner address must be 1..%d bytes", maxOwner)
	}
	var owner []byte
	err := h.pool.QueryRow(ctx, `INSERT INTO aov_agent_owners (agent_id, owner) VALUES ($1, $2)
		ON CONFLICT (agent_id) DO NOTHING RETURNING owner`, []byte(agentID), []byte(wallet)).Scan(&owner)
	if errors.Is(err, pgx.ErrNoRows) {
		// Someone bound it first. Its row may have committed after this
		// statement's snapshot, so read it in a new statement.
		o, err := h.AgentOwner(ctx, agentID)
		if err == nil && o == "" {
			err = errors.New("store: agent owner vanished")
		}
		return o, err
	}
	if err != nil {
		return "", fmt.Errorf("history: binding agent owner: %w", err)
	}
	return string(owner), nil
}

// AgentOwner returns agentID's owner, or "" when nobody bound it.
func (h *History) AgentOwner(ctx context.Context, agentID string) (string, error) {
	if len(agentID) > maxAgentID {
		return "", nil
	}
	var owner []byte
	err := h.pool.QueryRow(ctx, `SELECT owner FROM aov_agent_owners WHERE agent_id = $1`, []byte(agentID)).Scan(&owner)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("history: reading agent owner: %w", err)
	}
	return string(owner), nil
}
