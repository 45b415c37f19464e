"""What users call: Omni (synchronous), AsyncOmni (asyncio), the `omni` CLI."""
