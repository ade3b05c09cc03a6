#!/usr/bin/env bash
# Vendors the Swagger UI assets that /docs serves from the binary (go:embed):
# only the files the page loads plus the licence texts, straight from the
# swagger-ui-dist npm package, so no page ever needs a CDN.
#
#   apidocs/ui/update.sh            # the latest swagger-ui-dist
#   apidocs/ui/update.sh 5.35.0     # a given version
#
# It records the version and the package's integrity hash in VERSION; the Go
# tests check that the embedded files are present and that VERSION names them.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
version="${1:-$(npm view swagger-ui-dist version)}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

cd "$tmp"
npm pack --silent "swagger-ui-dist@${version}" >/dev/null
tar xzf "swagger-ui-dist-${version}.tgz"
integrity="$(npm view "swagger-ui-dist@${version}" dist.integrity)"

for f in swagger-ui.css swagger-ui-bundle.js swagger-ui-bundle.js.LICENSE.txt LICENSE NOTICE; do
	cp "package/$f" "$here/$f"
done
# The files are copied byte for byte (check them against the package with
# the integrity hash below); the source maps stay out of the binary.

cat >"$here/VERSION" <<EOV
swagger-ui-dist ${version}
integrity ${integrity}
EOV
echo "vendored swagger-ui-dist ${version} into ${here}"
