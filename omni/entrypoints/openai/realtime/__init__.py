"""`/v1/realtime`: spoken conversations over a WebSocket, wire-compatible with OpenAI's Realtime
API (the GA protocol; the official `openai` client's `client.realtime.connect` works unchanged).

Modules by concern: `endpoint` (the upgrade: key, model), `connection` (the session loop: client
events in order, one response at a time, barge-in, disconnects), `events` (client events as
strict models; the event size limit), `server_events` (the envelope, `error`, ids),
`session_state` (session settings, `session.update`, response overrides, the GA session object),
`conversation` (items and the prompt of the next response), `input_audio` (pcm16, the input
buffer and its limit, resampling), `vad` (Silero VAD -> speech start and end), `response` (one
response through AsyncOmni as events). docs/serving.md shows a session end to end.
"""
