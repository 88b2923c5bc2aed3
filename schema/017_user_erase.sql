-- 017: a user's data (server.md, "Rate limits and moderation"; issue 52
-- item 4). An erase (DELETE /v1/users/{user} {"erase":true}, imserver
-- admin user erase) keeps every event row, so seqs stay gap-free, and
-- removes its content: body, attachments, emoji and the request key
-- (which moves to idem_tombstones, as retention purge does, so a late
-- resend answers ORIGINAL_EXPIRED). `erased` marks such a row: every
-- page, fetch, push and the backend API's events show it as
-- `"erased": true` without content (docs/protocol.md, "Erased events").
-- A constant default: PostgreSQL adds the column without rewriting events.
ALTER TABLE events ADD COLUMN erased boolean NOT NULL DEFAULT false;

-- When an erase of the user was first asked for; kept (the row is what the
-- events' sender_user and the tombstones name). A rerun of an interrupted
-- erase finds the rest by `events.erased`.
ALTER TABLE users ADD COLUMN erased_at timestamptz;
