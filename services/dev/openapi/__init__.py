"""An OpenAPI 3.0.3 document of the JSON edge, generated from the descriptor set the edge
transcodes with (gen/atelier.binpb), so the document, the edge and gRPC cannot disagree.
`scripts/gen-protos.sh` writes it to gen/openapi.json; docs/openapi.md explains it."""
