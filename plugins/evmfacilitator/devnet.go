package evmfacilitator

import (
	"context"
	"crypto/ecdsa"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/rawdb"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/eth/ethconfig"
	"github.com/ethereum/go-ethereum/ethclient"
	"github.com/ethereum/go-ethereum/ethclient/simulated"
	"github.com/ethereum/go-ethereum/node"
	"github.com/ethereum/go-ethereum/params"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/aovhq/aov/x402"
)

// DevnetChainID is the chain id of the development chain; go-ethereum's
// simulated backend always uses 1337.
const DevnetChainID = 1337

// DevnetNetwork is the devnet's CAIP-2 network id.
const DevnetNetwork = "eip155:1337"

// DevnetUSDCPerAccount is the test USDC (in atomic units, 6 decimals) minted
// to each of development accounts 1 to 9: 1,000,000 USDC.
const DevnetUSDCPerAccount = 1_000_000_000_000

// devnetETHPerAccount is each development account's genesis ETH: 10,000 ETH.
var devnetETHPerAccount = new(big.Int).Mul(big.NewInt(10_000), big.NewInt(1e18))

// devnetRPCOrigins are the web origins whose pages may call the devnet's
// JSON-RPC from a browser (CORS): any page served from this machine's
// loopback names, on any port, such as the official paywall page of a
// gateway under make run (it reads the chain, balances and token metadata
// from the chain's RPC), a wallet or a dapp in development. A page from
// any other site gets no CORS answer, so the browser keeps it from
// reading or sending anything but a simple request (which go-ethereum
// refuses: it takes only application/json). Pages that may call it can
// read the chain and send transactions signed with its keys, all of which
// are public test keys; no key is unlocked on the node.
var devnetRPCOrigins = []string{
	"http://localhost", "http://localhost:*",
	"http://127.0.0.1", "http://127.0.0.1:*",
	"http://[::1]", "http://[::1]:*",
}

// devnetRPCHosts are the Host header names the devnet's JSON-RPC answers:
// localhost and the name it listens on. go-ethereum answers any IP address
// itself, so a client on 127.0.0.1 or the listen address always gets
// through; what this keeps out is a page of another site that points its
// own DNS name at this machine (DNS rebinding) to get round CORS.
func devnetRPCHosts(listenHost string) []string {
	hosts := []string{"localhost"}
	if listenHost != "" && listenHost != "localhost" && net.ParseIP(listenHost) == nil {
		hosts = append(hosts, listenHost)
	}
	return hosts
}

// DevnetConfig configures StartDevnet.
type DevnetConfig struct {
	// RPCListen, when set, serves the chain's JSON-RPC over HTTP (namespaces
	// eth, net, web3) on this host:port, for wallets, viem or another
	// facilitator. Port 0 picks a free port (see Devnet.RPCURL). Empty: the
	// chain is reachable in process only. Web pages on a loopback origin
	// (devnetRPCOrigins) may call it from a browser.
	RPCListen string
	// MaxClockLead bounds how far block timestamps may run ahead of the wall
	// clock. Every block must be at least one second after its parent, so a
	// burst of blocks pushes chain time ahead; once it is this far ahead the
	// devnet waits before sealing the next block. Authorizations are checked
	// by the token against block time, so a large lead makes fresh
	// authorizations look expired early. Default 10s.
	MaxClockLead time.Duration
	// IdleBlockAfter is how old the newest block may get while no
	// transaction is pending before an empty block is sealed, so that
	// eth_call simulations see a block time close to the wall clock.
	// Default 2s.
	IdleBlockAfter time.Duration
	// DataDir, when set, keeps the chain (blocks, state: balances, nonces,
	// contracts) in this folder, so it survives a restart: the next
	// StartDevnet with the same folder continues from the last sealed
	// block. Empty: the chain lives in memory and is lost on Close.
	DataDir string

	// forks replaces the chain's fork schedule (default
	// params.AllDevChainProtocolChanges, which prices storage by forks no
	// public chain runs yet): tests measure gas as on a public chain.
	forks *params.ChainConfig
	// gasLimit replaces the blocks' gas limit (default go-ethereum's
	// miner ceiling, 60M, four times what one transaction may use since
	// EIP-7825): tests fill blocks with one transaction each to raise the
	// base fee.
	gasLimit uint64
}

// Devnet is an in-process development chain (go-ethereum's simulated
// backend, chain id 1337) with the test USDC token deployed and the
// development accounts funded. A committer seals a block whenever
// transactions are pending, with block time following the wall clock, so
// settlement behaves as on a real chain with fast blocks.
//
// It is for development and tests: every key on it is public, and its state
// lives in memory and is lost on Close unless DevnetConfig.DataDir keeps it.
type Devnet struct {
	backend *chainBackend
	client  *ethclient.Client
	rpc     *rpc.Client
	token   common.Address
	rpcURL  string
	cfg     DevnetConfig
	// nonces are the chain's nonce managers, shared by its facilitators,
	// SendTx and the process's other users of this chain (an evm
	// facilitator pointed at its RPC: chainNonces).
	nonces *nonceSet

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error
}

// StartDevnet starts a devnet: genesis funds the ten development accounts
// with ETH, account 0 deploys the test token and mints 1,000,000 test USDC to
// each of accounts 1 to 9.
func StartDevnet(cfg DevnetConfig) (*Devnet, error) {
	if cfg.MaxClockLead <= 0 {
		cfg.MaxClockLead = 10 * time.Second
	}
	if cfg.IdleBlockAfter <= 0 {
		cfg.IdleBlockAfter = 2 * time.Second
	}
	alloc := types.GenesisAlloc{}
	for _, a := range DevAccounts() {
		alloc[a.Address] = types.Account{Balance: new(big.Int).Set(devnetETHPerAccount)}
	}
	var opts []func(*node.Config, *ethconfig.Config)
	rpcURL := ""
	if cfg.RPCListen != "" {
		host, port, err := listenAddr(cfg.RPCListen)
		if err != nil {
			return nil, fmt.Errorf("devnet rpc_listen: %w", err)
		}
		rpcURL = "http://" + net.JoinHostPort(host, strconv.Itoa(port))
		opts = append(opts, func(nc *node.Config, _ *ethconfig.Config) {
			nc.HTTPHost = host
			nc.HTTPPort = port
			nc.HTTPModules = []string{"eth", "net", "web3"}
			nc.HTTPVirtualHosts = devnetRPCHosts(host)
			nc.HTTPCors = devnetRPCOrigins
		})
	}
	if cfg.DataDir != "" {
		if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
			return nil, fmt.Errorf("devnet data_dir: %w", err)
		}
		dir := cfg.DataDir
		opts = append(opts, func(nc *node.Config, ec *ethconfig.Config) {
			nc.DataDir = dir
			// go-ethereum runs pebble in asynchronous write mode (a write
			// returns while its log entry is still in memory), so a
			// killed process loses its recent blocks; leveldb's journal
			// reaches the OS on every write. With archive mode
			// (every block's state written as it is sealed, hash scheme),
			// a crash (SIGKILL) loses no sealed block.
			nc.DBEngine = "leveldb"
			ec.NoPruning = true
			ec.StateScheme = rawdb.HashScheme
		})
	}
	if cfg.forks != nil {
		opts = append(opts, func(_ *node.Config, ec *ethconfig.Config) {
			if ec.Genesis != nil {
				ec.Genesis.Config = cfg.forks
			}
		})
	}
	if cfg.gasLimit != 0 {
		opts = append(opts, func(_ *node.Config, ec *ethconfig.Config) {
			if ec.Genesis != nil {
				ec.Genesis.GasLimit = cfg.gasLimit
			}
			ec.Miner.GasCeil = cfg.gasLimit
		})
	}
	backend, err := newBackend(alloc, opts)
	if err != nil {
		return nil, fmt.Errorf("starting devnet chain: %w", err)
	}
	d := &Devnet{
		backend: backend,
		client:  backend.client,
		rpcURL:  rpcURL,
		cfg:     cfg,
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	d.rpc = d.client.Client()
	resumed, err := d.resumed()
	if err != nil {
		backend.Close()
		return nil, fmt.Errorf("resuming devnet from %s: %w", cfg.DataDir, err)
	}
	if !resumed {
		if err := d.setup(); err != nil {
			backend.Close()
			return nil, fmt.Errorf("setting up devnet: %w", err)
		}
	}
	if err := x402.RegisterAsset(d.Asset()); err != nil {
		backend.Close()
		return nil, fmt.Errorf("registering the devnet token: %w", err)
	}
	genesis, err := d.client.HeaderByNumber(context.Background(), big.NewInt(0))
	if err != nil {
		backend.Close()
		return nil, fmt.Errorf("reading the devnet's genesis block: %w", err)
	}
	d.nonces = devnetNonces(chainIdentity{id: big.NewInt(DevnetChainID).String(), genesis: genesis.Hash()})
	go d.commitLoop()
	return d, nil
}

// listenAddr splits host:port; port 0 is replaced by a free port, because
// the node does not report the port it picked.
func listenAddr(addr string) (string, int, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("invalid port %q", portStr)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	if port == 0 {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return "", 0, err
		}
		port = l.Addr().(*net.TCPAddr).Port
		l.Close()
	}
	return host, port, nil
}

// setup deploys the token and mints, committing blocks by hand (the
// committer is not running yet).
func (d *Devnet) setup() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	deployer := DevKey(0)
	tx, err := d.signTx(ctx, deployer, 0, nil, hexCode(testUSDCBin), 3_000_000)
	if err != nil {
		return fmt.Errorf("deploying test token: %w", err)
	}
	d.token = devnetToken()
	txs := []*types.Transaction{tx}
	for i, a := range DevAccounts()[1:] {
		data, err := tokenABI.Pack("mint", a.Address, big.NewInt(DevnetUSDCPerAccount))
		if err != nil {
			return err
		}
		tx, err := d.signTx(ctx, deployer, uint64(i+1), &d.token, data, 1_000_000)
		if err != nil {
			return fmt.Errorf("minting test USDC: %w", err)
		}
		txs = append(txs, tx)
	}
	for _, tx := range txs {
		if err := d.client.SendTransaction(ctx, tx); err != nil {
			return fmt.Errorf("sending setup transaction: %w", err)
		}
	}
	// Seal until every setup transaction has a receipt: the pool may still be
	// promoting the later mints when the first block is built, and the node
	// may still be indexing a block right after sealing it.
	for _, tx := range txs {
		var r *types.Receipt
		for {
			if r, err = d.client.TransactionReceipt(ctx, tx.Hash()); err == nil {
				break
			}
			if ctx.Err() != nil {
				return fmt.Errorf("setup transaction receipt: %w", err)
			}
			d.backend.Commit()
			time.Sleep(5 * time.Millisecond)
		}
		if r.Status != types.ReceiptStatusSuccessful {
			return fmt.Errorf("setup transaction %d reverted (gas used %d of %d)", r.TransactionIndex, r.GasUsed, tx.Gas())
		}
	}
	return nil
}

// devnetToken is where setup deploys the test token: the first contract of
// development account 0.
func devnetToken() common.Address {
	return crypto.CreateAddress(crypto.PubkeyToAddress(DevKey(0).PublicKey), 0)
}

// signTx builds and signs an EIP-1559 transaction of the devnet.
func (d *Devnet) signTx(ctx context.Context, key *ecdsa.PrivateKey, nonce uint64, to *common.Address, data []byte, gas uint64) (*types.Transaction, error) {
	sign, err := d.txSigner(ctx, key, to, data, gas)
	if err != nil {
		return nil, err
	}
	return sign(nonce)
}

// txSigner reads the fees from the chain head and returns a signer of the
// transaction for any nonce, so that the nonce can be picked last, under
// the account's nonce lock, with no chain read in between.
func (d *Devnet) txSigner(ctx context.Context, key *ecdsa.PrivateKey, to *common.Address, data []byte, gas uint64) (func(nonce uint64) (*types.Transaction, error), error) {
	head, err := d.client.HeaderByNumber(ctx, nil)
	if err != nil {
		return nil, err
	}
	tip := big.NewInt(1e9)
	feeCap := new(big.Int).Add(new(big.Int).Mul(head.BaseFee, big.NewInt(2)), tip)
	signer := types.LatestSignerForChainID(big.NewInt(DevnetChainID))
	return func(nonce uint64) (*types.Transaction, error) {
		return types.SignNewTx(key, signer, &types.DynamicFeeTx{
			ChainID: big.NewInt(DevnetChainID), Nonce: nonce, GasTipCap: tip, GasFeeCap: feeCap,
			Gas: gas, To: to, Data: data,
		})
	}, nil
}

// commitLoop seals a block whenever transactions are pending (woken by the
// new-pending-transaction subscription, with a short poll as a fallback), and
// an empty block when the chain has been idle for IdleBlockAfter. Block time
// is the wall clock (the simulated beacon stamps blocks with time.Now, at
// least one second after the parent); a blind commit loop would drift the
// chain ahead of the wall clock, so a block is sealed only when needed and
// never more than MaxClockLead ahead.
func (d *Devnet) commitLoop() {
	defer close(d.done)
	pending := make(chan common.Hash, 1024)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sub, err := d.rpc.EthSubscribe(ctx, pending, "newPendingTransactions")
	var subErr <-chan error
	if err == nil {
		defer sub.Unsubscribe()
		subErr = sub.Err()
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-d.stop:
			return
		case <-subErr:
			subErr = nil // fall back to polling
		case <-pending:
		drain:
			for {
				select {
				case <-pending:
				default:
					break drain
				}
			}
		case <-tick.C:
		}
		d.maybeSeal(ctx)
	}
}

// maybeSeal seals one block if transactions are pending (and the chain is
// not too far ahead of the wall clock) or the chain has been idle too long.
func (d *Devnet) maybeSeal(ctx context.Context) {
	var status struct {
		Pending hexutil.Uint64 `json:"pending"`
	}
	if err := d.rpc.CallContext(ctx, &status, "txpool_status"); err != nil {
		return
	}
	head, err := d.client.HeaderByNumber(ctx, nil)
	if err != nil {
		return
	}
	headTime := time.Unix(int64(head.Time), 0)
	now := time.Now()
	switch {
	case status.Pending > 0:
		if headTime.After(now.Add(d.cfg.MaxClockLead)) {
			return // too far ahead: wait for the clock
		}
		d.backend.Commit()
	case now.Sub(headTime) >= d.cfg.IdleBlockAfter:
		d.backend.Commit()
	}
}

// Client returns an in-process client of the chain.
func (d *Devnet) Client() simulated.Client { return d.client }

// SettledHead returns the number of the newest block of the chain c reads
// whose state includes every transaction whose receipt c showed before the
// call: the block to read a settlement's effects at (a balance, an
// authorization's state) once the facilitator has reported it. c is a
// Devnet's Client or an ethclient of its RPC.
//
// The latest block is not always that block. When go-ethereum makes a
// block the head it first writes the block's canonical number and its
// transactions' index, which make their receipts readable, and only then
// moves "latest" to it; a read at latest in between sees the parent's
// state while the receipt is already there. A machine under load can stall
// the node's goroutine in that gap for milliseconds. What go-ethereum
// writes first is readable too: while a block above latest is already
// canonical, latest is about to move, and SettledHead reads again.
func SettledHead(ctx context.Context, c interface {
	BlockNumber(context.Context) (uint64, error)
	HeaderByNumber(context.Context, *big.Int) (*types.Header, error)
}) (*big.Int, error) {
	for {
		n, err := c.BlockNumber(ctx)
		if err != nil {
			return nil, err
		}
		_, err = c.HeaderByNumber(ctx, new(big.Int).SetUint64(n+1))
		switch {
		case errors.Is(err, ethereum.NotFound):
			return new(big.Int).SetUint64(n), nil
		case err != nil:
			return nil, err
		}
		select { // block n+1 is canonical: latest moves to it in a moment
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// Token returns the address of the test USDC token.
func (d *Devnet) Token() common.Address { return d.token }

// Asset returns the test token as the devnet's x402 USDC asset; StartDevnet
// registers it with x402.RegisterAsset, so x402.USDC(DevnetNetwork) finds it.
func (d *Devnet) Asset() x402.Asset {
	return x402.Asset{Network: DevnetNetwork, Address: d.token.Hex(), Name: "USD Coin", Version: "2", Decimals: 6}
}

// NewFacilitator returns a facilitator on this devnet whose relayer is
// development account 0, polling receipts every 20ms (blocks are sealed as
// soon as a transaction is pending).
func (d *Devnet) NewFacilitator() (*Facilitator, error) {
	return newFacilitator(Config{Chain: d.client, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 30 * time.Second}, d.nonces)
}

// RPCURL returns the HTTP JSON-RPC URL ("http://127.0.0.1:8545"), or "" when
// DevnetConfig.RPCListen was empty.
func (d *Devnet) RPCURL() string { return d.rpcURL }

// SendTx sends data from key to `to` (nil: a contract creation) with a gas
// limit of 3,000,000 and waits, until ctx ends, for the receipt and for
// latest to include it; a reverted transaction is an error. Tests and demos use it to change the chain's
// state (deploy a contract, move test USDC) the way any wallet would. It
// takes the nonce from the account's nonce manager, so its sends from
// account 0 never take the nonce of a settlement by the devnet's relayer.
func (d *Devnet) SendTx(ctx context.Context, key *ecdsa.PrivateKey, to *common.Address, data []byte) (*types.Receipt, error) {
	sign, err := d.txSigner(ctx, key, to, data, 3_000_000)
	if err != nil {
		return nil, fmt.Errorf("reading the fees: %w", err)
	}
	tx, err := d.nonces.of(crypto.PubkeyToAddress(key.PublicKey)).submit(ctx, ctx, d.client, sign)
	if err != nil {
		return nil, err
	}
	for {
		if r, err := d.client.TransactionReceipt(ctx, tx.Hash()); err == nil {
			if r.Status != types.ReceiptStatusSuccessful {
				return r, errors.New("transaction reverted")
			}
			// A receipt is readable before latest moves to its block
			// (SettledHead): wait for it, so that a read at latest right
			// after (the contract's code, a balance) sees the change.
			if _, err := SettledHead(ctx, d.client); err != nil {
				return r, fmt.Errorf("waiting for the head to include the transaction: %w", err)
			}
			return r, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("transaction not mined: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// DeployTestWallet deploys the project's EIP-1271 test wallet
// (contracts/TestSmartWallet.sol) owned by owner, from development account
// 0, and returns its address: a contract account whose owner's signatures
// it accepts, for trying payments and wallet proofs from smart wallets.
func (d *Devnet) DeployTestWallet(ctx context.Context, owner common.Address) (common.Address, error) {
	args, err := mustABI(testWalletABIJSON).Pack("", owner)
	if err != nil {
		return common.Address{}, err
	}
	r, err := d.SendTx(ctx, DevKey(0), nil, append(hexCode(testWalletBin), args...))
	if err != nil {
		return common.Address{}, fmt.Errorf("deploying the test wallet: %w", err)
	}
	return r.ContractAddress, nil
}

// Close stops the committer and the chain. It is safe to call more than once.
func (d *Devnet) Close() error {
	d.closeOnce.Do(func() {
		close(d.stop)
		<-d.done
		d.closeErr = d.backend.Close()
	})
	return d.closeErr
}
