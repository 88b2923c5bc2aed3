-- 014: attachments (server.md "Attachments", contract section 12).
--
-- uploads: one row per upload (its declared name, mime, size and SHA-256,
-- how many bytes have arrived, whether it is complete). Only its uploader
-- ever sees an incomplete one. `store` says where its bytes live: 'pg'
-- (upload_chunks, below; the default) or 'dir' (--attachments-dir, a file
-- named by att_id).
--
-- upload_chunks: the bytes of a 'pg' upload, one row per piece written
-- (at most attachment_piece_bytes, server/src/store/attachments.hpp), keyed
-- by its offset. Files are mostly compressed already: EXTERNAL storage
-- skips PostgreSQL's compression attempt and lets a range read fetch only
-- the slices it needs.
--
-- event_attachments: which uploads a msg references, in the order given.
-- It cascades with its event (retention purge), and it holds its upload
-- (no cascade): the garbage collector can never delete bytes that a
-- readable message still references.

CREATE TABLE uploads (
    att_id       uuid PRIMARY KEY,
    owner_user   text NOT NULL REFERENCES users (user_id),
    name         text NOT NULL,
    mime         text NOT NULL,
    size         bigint NOT NULL CHECK (size >= 0),
    sha256       bytea NOT NULL CHECK (length(sha256) = 32),
    received     bigint NOT NULL DEFAULT 0 CHECK (received >= 0 AND received <= size),
    complete     boolean NOT NULL DEFAULT false,
    store        text NOT NULL DEFAULT 'pg' CHECK (store IN ('pg', 'dir')),
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    completed_at timestamptz
);
CREATE INDEX uploads_by_owner ON uploads (owner_user, created_at);
-- The collector's scan: incomplete uploads by their last write.
CREATE INDEX uploads_incomplete ON uploads (updated_at) WHERE NOT complete;

CREATE TABLE upload_chunks (
    att_id uuid NOT NULL REFERENCES uploads (att_id) ON DELETE CASCADE,
    off    bigint NOT NULL CHECK (off >= 0),
    len    integer NOT NULL CHECK (len > 0),
    data   bytea NOT NULL,
    PRIMARY KEY (att_id, off)
);
ALTER TABLE upload_chunks ALTER COLUMN data SET STORAGE EXTERNAL;

CREATE TABLE event_attachments (
    conv_id text NOT NULL,
    seq     bigint NOT NULL,
    ord     smallint NOT NULL CHECK (ord >= 0),
    att_id  uuid NOT NULL REFERENCES uploads (att_id),
    PRIMARY KEY (conv_id, seq, ord),
    FOREIGN KEY (conv_id, seq) REFERENCES events (conv_id, seq) ON DELETE CASCADE
);
-- Visibility of a download and the collector's "still referenced".
CREATE INDEX event_attachments_by_att ON event_attachments (att_id);

-- A msg's attachments as every page, fetch and push shows them (contract
-- section 12: {att_id, name, mime, size, sha256} in the order given): an
-- upload's row never changes once complete, so the list is written once
-- with the event (schema/functions/im_send.sql) and read with it, no join.
ALTER TABLE events ADD COLUMN attachments jsonb;
