"""speczoo.decoding: speculative decoding on token ids — the Draft/Verdict types, the pure verify
functions, the cost model, the controller, the drafters and the engine that alone owns the caches.

Named `decoding`, not `spec`, because "spec" already names the `--spec` mode and the OpenAPI spec, and
common tooling takes a folder named spec/ for tests. Nothing here knows text, the zoo or the server."""
