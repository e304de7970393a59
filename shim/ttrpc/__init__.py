"""ttrpc on asyncio: framing (pure), codec, per-connection protocol, server dispatch, client."""
