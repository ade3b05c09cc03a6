// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.20;

/// @title TestSmartWallet: the smallest EIP-1271 contract account.
/// @notice Accepts a signature when its owner's key signed the digest. It lets
/// tests pay from a contract wallet (x402 payers such as smart wallets sign this
/// way). Not for any production network.
contract TestSmartWallet {
    bytes4 private constant EIP1271_MAGIC = 0x1626ba7e;
    address public immutable owner;

    constructor(address owner_) {
        owner = owner_;
    }

    function isValidSignature(bytes32 digest, bytes calldata signature) external view returns (bytes4) {
        if (signature.length != 65) return 0xffffffff;
        bytes32 r = bytes32(signature[0:32]);
        bytes32 s = bytes32(signature[32:64]);
        uint8 v = uint8(signature[64]);
        if (v < 27) v += 27;
        address recovered = ecrecover(digest, v, r, s);
        return recovered != address(0) && recovered == owner ? EIP1271_MAGIC : bytes4(0xffffffff);
    }
}
