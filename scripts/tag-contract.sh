#!/usr/bin/env bash
# Freezes the public contract as released: writes contract/<version>.binpb (a buf image of
# protos/, without comments) and tags the commit contract-<version>. `make breaking`
# compares the tree with that image from then on, so it needs no git history: a clean
# clone or a shallow CI checkout checks against the same release. Run it only when a
# contract version is released; later changes must stay compatible with every image here.
set -euo pipefail
cd "$(dirname "$0")/.."
version="${1:?usage: scripts/tag-contract.sh v1.0.0}"
mkdir -p contract
buf build protos --exclude-source-info -o "contract/$version.binpb"
echo "wrote contract/$version.binpb; commit it, then: git tag contract-$version"
