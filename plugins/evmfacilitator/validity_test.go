package evmfacilitator

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"

	"github.com/aovhq/aov/x402"
)

// One check makes at most maxLogBlocks/logChunkBlocks eth_getLogs, however
// the blocks left to search are split by the runs remembered for the
// nonce: each run's last, partial chunk is a call of its own. Scaled
// constants: 5 blocks a call, 50 in all: 10 calls. Four one-block windows
// 12 blocks apart leave 5 runs of one window over them (11 + 11 + 11 + 11
// + 6 = 50 blocks, 15 calls searched whole); the search is cut to 10 calls,
// an unknown outcome, not an answer from a part of the window.
func TestValidityWindowSearchCallsAreBoundedWithManyRuns(t *testing.T) {
	oldChunk, oldMax := logChunkBlocks, maxLogBlocks
	logChunkBlocks, maxLogBlocks = 5, 50
	t.Cleanup(func() { logChunkBlocks, maxLogBlocks = oldChunk, oldMax })

	d := startDevnet(t, DevnetConfig{MaxClockLead: time.Hour})
	ctx := context.Background()
	for range 5 {
		d.backend.Commit()
	}
	spy := &logSpy{Chain: d.Client()}
	reader := statusReader(t, spy)
	paid := settleOne(t, d, nil, nil)
	settled, err := d.Client().HeaderByNumber(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 90 {
		d.backend.Commit()
	}
	S := settled.Number.Uint64()
	timeOf := func(n uint64) uint64 {
		h, err := d.Client().HeaderByNumber(ctx, new(big.Int).SetUint64(n))
		if err != nil {
			t.Fatal(err)
		}
		return h.Time
	}
	ask := func(validAfter, validBefore uint64) (x402.SettlementStatus, error, int) {
		o := paid.a
		o.ValidAfter, o.ValidBefore = fmt.Sprint(validAfter), fmt.Sprint(validBefore)
		spy.reset()
		st, err := reader.SettlementStatus(ctx, sign(t, payer, o, paid.req, paid.req), paid.req)
		_, ranges := spy.reset()
		return st, err, len(ranges)
	}
	// Four one-block windows after the settlement: four runs remembered.
	b1 := S + 15
	for i := uint64(0); i < 4; i++ {
		b := b1 + 12*i
		if st, err, _ := ask(timeOf(b)-1, timeOf(b)+1); err != nil || st.State != x402.SettlementNever {
			t.Fatalf("one-block window at block %d: %+v, %v; want never", b, st, err)
		}
	}
	st, err, calls := ask(timeOf(b1-11)-1, timeOf(b1+36+7))
	if bound := int(maxLogBlocks / logChunkBlocks); calls > bound {
		t.Errorf("one check made %d eth_getLogs; at most %d (maxLogBlocks/logChunkBlocks)", calls, bound)
	}
	var ue *x402.UnknownOutcomeError
	if !errors.As(err, &ue) || st.State != x402.SettlementUndecided {
		t.Errorf("a window whose runs need more calls than the bound: %+v, %v; want an unknown outcome (cut short)", st, err)
	}
}

// laggingLogs is a fake RPC pool (a fault a single devnet node cannot
// show): the devnet's client, except that eth_getLogs is served by a node
// whose head is block lag (when not zero), behind the one that answers
// the head and authorizationState, as providers' pools are; like geth,
// that node answers a range past its head with the logs it has, no error.
type laggingLogs struct {
	Chain
	lag atomic.Uint64
}

func (c *laggingLogs) FilterLogs(ctx context.Context, q ethereum.FilterQuery) ([]types.Log, error) {
	if lag := c.lag.Load(); lag > 0 && q.BlockHash == nil && q.ToBlock != nil {
		if q.FromBlock.Uint64() > lag {
			return nil, nil
		}
		if q.ToBlock.Uint64() > lag {
			q.ToBlock = new(big.Int).SetUint64(lag)
		}
	}
	return c.Chain.FilterLogs(ctx, q)
}

// A payment that just settled, asked about through a pool whose
// eth_getLogs node has not seen the settlement's block yet, is an unknown
// outcome, never "never" (the plain refusal of a buyer who was charged):
// the nonce reads unused before the recent blocks searched and used at
// their end, so its use is in blocks the logs called empty. So is another
// window of the nonce that ended before the head. Nothing is remembered
// of those blocks: once the node caught up, the payment is done, and the
// other window's authorization, which that transaction never executed
// (its call names the payment's), is never. (Before: done too, by the
// payment's transfer.)
func TestLaggingLogIndexIsUnknownNotNever(t *testing.T) {
	d := startDevnet(t, DevnetConfig{MaxClockLead: time.Hour})
	ctx := context.Background()
	for range 10 {
		d.backend.Commit()
	}
	lag := &laggingLogs{Chain: d.Client()}
	reader := statusReader(t, lag)
	paid := settleOne(t, d, nil, nil)
	rc, err := d.Client().TransactionReceipt(ctx, common.HexToHash(paid.r.Transaction))
	if err != nil {
		t.Fatal(err)
	}
	S := rc.BlockNumber.Uint64()
	settled, err := d.Client().HeaderByNumber(ctx, rc.BlockNumber)
	if err != nil {
		t.Fatal(err)
	}
	// Another authorization of the nonce, valid in the settlement's block
	// alone: its window ends before the head once more blocks follow.
	o := paid.a
	o.ValidAfter, o.ValidBefore = fmt.Sprint(settled.Time-1), fmt.Sprint(settled.Time+1)
	short := sign(t, payer, o, paid.req, paid.req)

	lag.lag.Store(S - 1)
	var ue *x402.UnknownOutcomeError
	st, err := reader.SettlementStatus(ctx, paid.p, paid.req)
	if !errors.As(err, &ue) || st.State != x402.SettlementUndecided {
		t.Errorf("settled in the head block, logs one block behind: %+v, %v; want an unknown outcome", st, err)
	}
	for range 3 {
		d.backend.Commit()
	}
	st, err = reader.SettlementStatus(ctx, short, paid.req)
	if !errors.As(err, &ue) || st.State != x402.SettlementUndecided {
		t.Errorf("a window ended before the head, logs behind it: %+v, %v; want an unknown outcome", st, err)
	}

	lag.lag.Store(0)
	st, err = reader.SettlementStatus(ctx, paid.p, paid.req)
	if err != nil || st.State != x402.SettlementDone || st.Transaction != paid.r.Transaction {
		t.Errorf("the settled payment, the logs caught up: %+v, %v; want done by %s", st, err, paid.r.Transaction)
	}
	st, err = reader.SettlementStatus(ctx, short, paid.req)
	if err != nil || st.State != x402.SettlementNever || st.Transaction != "" {
		t.Errorf("the one-block window, the logs caught up: %+v, %v; want never (%s executed the settled payment, not this one)", st, err, paid.r.Transaction)
	}
}

// stateAt is a fake chain for a fault a devnet cannot show (a node that
// pruned historical state): the devnet's client, counting eth_call at a
// block number, and failing them while pruned is set.
type stateAt struct {
	Chain
	calls  atomic.Int32
	pruned atomic.Bool
}

func (c *stateAt) CallContract(ctx context.Context, msg ethereum.CallMsg, block *big.Int) ([]byte, error) {
	if block != nil {
		c.calls.Add(1)
		if c.pruned.Load() {
			return nil, errors.New("missing trie node (state pruned)")
		}
	}
	return c.Chain.CallContract(ctx, msg, block)
}

// Not finding the nonce's log in recent blocks costs at most two reads of
// its state at a block, and a read that fails is an unknown outcome, never
// "never"; blocks older than recentBlocks below the head are trusted as
// searched, without a state read.
func TestRecentNotFoundIsProvenByState(t *testing.T) {
	d := startDevnet(t, DevnetConfig{MaxClockLead: time.Hour})
	ctx := context.Background()
	for range 5 {
		d.backend.Commit()
	}
	chain := &stateAt{Chain: d.Client()}
	reader := statusReader(t, chain)
	paid := settleOne(t, d, nil, nil)
	settled, err := d.Client().HeaderByNumber(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	S := settled.Number.Uint64()
	for range 10 {
		d.backend.Commit()
	}
	timeOf := func(n uint64) uint64 {
		h, err := d.Client().HeaderByNumber(ctx, new(big.Int).SetUint64(n))
		if err != nil {
			t.Fatal(err)
		}
		return h.Time
	}
	// ask asks about an authorization of the spent nonce valid in blocks
	// lo to hi, all after the settlement's: it never executed.
	ask := func(lo, hi uint64) (x402.SettlementStatus, error, int32) {
		o := paid.a
		o.ValidAfter, o.ValidBefore = fmt.Sprint(timeOf(lo)-1), fmt.Sprint(timeOf(hi)+1)
		chain.calls.Store(0)
		st, err := reader.SettlementStatus(ctx, sign(t, payer, o, paid.req, paid.req), paid.req)
		return st, err, chain.calls.Load()
	}
	if st, err, calls := ask(S+2, S+4); err != nil || st.State != x402.SettlementNever || calls > 2 {
		t.Errorf("recent window after the settlement: %+v, %v, %d state reads at a block; want never, at most 2", st, err, calls)
	}
	chain.pruned.Store(true)
	var ue *x402.UnknownOutcomeError
	if st, err, _ := ask(S+6, S+8); !errors.As(err, &ue) || st.State != x402.SettlementUndecided {
		t.Errorf("recent window, its state unreadable: %+v, %v; want an unknown outcome", st, err)
	}
	for range recentBlocks + 5 {
		d.backend.Commit()
	}
	if st, err, calls := ask(S+6, S+8); err != nil || st.State != x402.SettlementNever || calls != 0 {
		t.Errorf("window older than %d blocks, state unreadable: %+v, %v, %d state reads at a block; want never, none", recentBlocks, st, err, calls)
	}
}
