package evmfacilitator

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"maps"
	"os"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/eth"
	"github.com/ethereum/go-ethereum/eth/catalyst"
	"github.com/ethereum/go-ethereum/eth/ethconfig"
	"github.com/ethereum/go-ethereum/eth/filters"
	"github.com/ethereum/go-ethereum/ethclient"
	"github.com/ethereum/go-ethereum/node"
	"github.com/ethereum/go-ethereum/p2p"
	"github.com/ethereum/go-ethereum/params"
	"github.com/ethereum/go-ethereum/rpc"
)

// chainBackend is go-ethereum's simulated chain (a node with a simulated
// beacon sealing blocks on demand), set up as simulated.NewBackend does with
// one difference: it does not rewind the chain to genesis at start. On a
// fresh (or in-memory) database that changes nothing; on a DataDir that
// holds a chain, the chain continues from its last block, with its
// balances, nonces and contracts.
type chainBackend struct {
	node   *node.Node
	beacon *catalyst.SimulatedBeacon
	client *ethclient.Client
}

// newBackend starts the chain; opts adjust the node and eth configuration as
// simulated.NewBackend's options do (a nil ethconfig.Config.Genesis they
// leave alone). Its genesis block carries 32 random bytes as extra data,
// so that every devnet started afresh is a chain of its own (chainIdentity),
// although all are chain 1337. A DataDir already holding a chain keeps the
// genesis it was made with: the chain is started again from the one stored.
func newBackend(alloc types.GenesisAlloc, opts []func(*node.Config, *ethconfig.Config)) (*chainBackend, error) {
	extra := make([]byte, 32)
	if _, err := rand.Read(extra); err != nil {
		return nil, err
	}
	b, err := startBackend(alloc, extra, opts)
	var mismatch *core.GenesisMismatchError
	if errors.As(err, &mismatch) {
		b, err = startBackend(nil, nil, opts)
	}
	return b, err
}

// startBackend is newBackend with the genesis extra data given; a nil alloc
// starts the chain a DataDir holds, from its stored genesis.
func startBackend(alloc types.GenesisAlloc, extra []byte, opts []func(*node.Config, *ethconfig.Config)) (*chainBackend, error) {
	nodeConf := node.DefaultConfig
	nodeConf.DataDir = ""
	nodeConf.P2P = p2p.Config{NoDiscovery: true}

	genesisAlloc := core.SystemContractAllocs()
	maps.Copy(genesisAlloc, alloc)
	ethConf := ethconfig.Defaults
	ethConf.Genesis = &core.Genesis{
		Config:    params.AllDevChainProtocolChanges,
		GasLimit:  ethconfig.Defaults.Miner.GasCeil,
		Alloc:     genesisAlloc,
		ExtraData: extra,
	}
	if alloc == nil {
		ethConf.Genesis = nil
	}
	ethConf.SyncMode = ethconfig.FullSync
	ethConf.TxPool.NoLocals = true
	ethConf.LogNoHistory = true
	for _, o := range opts {
		o(&nodeConf, &ethConf)
	}
	if nodeConf.DataDir == "" {
		// The node holds no keys, but without a DataDir go-ethereum makes
		// an empty keystore folder in the temp directory at every start
		// and removes it only on a clean Close: every killed devnet would
		// leave one behind. Named explicitly, the folder is only ensured,
		// and the temp directory itself already exists.
		nodeConf.KeyStoreDir = os.TempDir()
	}

	stack, err := node.New(&nodeConf)
	if err != nil {
		return nil, err
	}
	backend, err := eth.New(stack, &ethConf)
	if err != nil {
		stack.Close()
		return nil, err
	}
	fs := filters.NewFilterSystem(backend.APIBackend, filters.Config{})
	stack.RegisterAPIs([]rpc.API{{Namespace: "eth", Service: filters.NewFilterAPI(fs)}})
	if err := stack.Start(); err != nil {
		stack.Close()
		return nil, err
	}
	beacon, err := catalyst.NewSimulatedBeacon(0, common.Address{}, backend)
	if err != nil {
		stack.Close()
		return nil, err
	}
	return &chainBackend{node: stack, beacon: beacon, client: ethclient.NewClient(stack.Attach())}, nil
}

// Commit seals a block of the pending transactions.
func (b *chainBackend) Commit() common.Hash { return b.beacon.Commit() }

// AdjustTime seals an empty block adjustment later than the head.
func (b *chainBackend) AdjustTime(adjustment time.Duration) error {
	return b.beacon.AdjustTime(adjustment)
}

// Close stops the chain; with a DataDir, go-ethereum writes what it still
// holds in memory first.
func (b *chainBackend) Close() error {
	b.client.Close()
	return errors.Join(b.beacon.Stop(), b.node.Close())
}

// resumed reports whether the chain already holds the test token: a DataDir
// with a chain from an earlier run, which needs no setup.
func (d *Devnet) resumed() (bool, error) {
	if d.cfg.DataDir == "" {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code, err := d.client.CodeAt(ctx, devnetToken(), nil)
	if err != nil {
		return false, fmt.Errorf("reading the test token: %w", err)
	}
	if len(code) == 0 {
		return false, nil
	}
	d.token = devnetToken()
	return true, nil
}
