// Attachments (server.md "Attachments", contract section 12): the uploads'
// rows (schema/014_attachments.sql) and their bytes. All SQL of attachments
// lives here; the HTTP layer (net/http_attachments.cpp) sees outcomes only.
//
// The bytes live behind one interface, BlobStore: in PostgreSQL (PgBlobStore,
// upload_chunks, the default: replicated with the database, nothing else to
// run) or in a shared directory (--attachments-dir). The uploads' rows are
// always in PostgreSQL: the offset a client resumes from is the row's
// `received`, moved in the same transaction as the bytes it counts.
#pragma once

#include "core/errors.hpp"
#include "core/faults.hpp"

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <openssl/evp.h>
#include <pqxx/pqxx>

namespace im {

class DbPool;

/// --max-attachment-bytes' default: the largest upload (declared size).
inline constexpr std::int64_t default_max_attachment_bytes = 104857600;
/// One PUT's body at most (server.md: "at most 8 MiB a request").
inline constexpr std::size_t max_upload_request_bytes = 8u << 20;
/// The unit of writing and reading: a PUT's body is written in pieces of at
/// most this many bytes (one transaction, one upload_chunks row each), and a
/// download is read in pieces of this size. The server holds at most one
/// piece per transfer in memory.
inline constexpr std::size_t attachment_piece_bytes = 1u << 20;
/// contract section 12: 1-10 att_ids per message.
inline constexpr std::size_t max_attachments_per_message = 10;
/// Bytes of a JSON request body on the attachment routes (POST /v1/uploads).
inline constexpr std::size_t max_upload_json_bytes = 4096;

/// An attachment request refused: the HTTP status and the code of its JSON
/// body ({"code","message"} and, for OFFSET_MISMATCH, "offset").
struct AttFailure {
    unsigned status = 400;
    std::string code;
    std::string message;
    std::optional<std::int64_t> offset;
};

template <class T>
using Att = std::variant<T, AttFailure>;

template <class T>
bool att_ok(const Att<T>& a) { return a.index() == 0; }

/// One upload as its row has it.
struct UploadState {
    std::string att_id, owner, name, mime, sha256; // sha256: 64 lowercase hex digits
    std::int64_t size = 0, received = 0;
    bool complete = false;
    std::string store; // "pg" or "dir"
    std::string stamp; // the row's updated_at (text): changes with every write, whoever wrote
};

/// Where the bytes of uploads live. Writes happen inside the transaction
/// that moves the upload's `received` (the PostgreSQL store writes its row
/// there; the directory store writes its file before that COMMIT).
class BlobStore {
public:
    virtual ~BlobStore() = default;
    /// "pg" or "dir": recorded in uploads.store.
    virtual const char* kind() const = 0;
    /// Writes `bytes` at `offset` (the upload's `received`, held by `tx`).
    virtual void write(pqxx::work& tx, const std::string& att, std::int64_t offset, std::string_view bytes) = 0;
    /// At most `max` bytes from `from` (fewer only at the end of what was written).
    std::string read(pqxx::connection_base& c, const std::string& att, std::int64_t from, std::size_t max) {
        std::string out;
        read_into(c, att, from, max, out);
        return out;
    }
    /// read() into `out`, replacing its bytes but keeping its capacity: a
    /// download turns two buffers over instead of allocating (and, pieces
    /// being mmap'ed, page-faulting and zeroing) a fresh piece each time.
    virtual void read_into(pqxx::connection_base& c, const std::string& att, std::int64_t from, std::size_t max,
                           std::string& out) = 0;
    /// Every byte of the upload goes (a digest mismatch restarts it at 0;
    /// the collector), inside `tx`.
    virtual void drop(pqxx::work& tx, const std::string& att) = 0;
    /// The upload's last byte arrived and its digest matched: make its bytes
    /// durable before `complete` is committed and answered.
    virtual void seal(const std::string& att) { (void)att; }
    /// The att_ids of the byte files older than `min_age_ms` (the directory
    /// store; the PostgreSQL store's chunks go with their row: none).
    virtual std::vector<std::string> files_older_than(std::int64_t min_age_ms) { (void)min_age_ms; return {}; }
};

/// The default store: chunks in upload_chunks, one row per piece.
class PgBlobStore : public BlobStore {
public:
    const char* kind() const override { return "pg"; }
    void write(pqxx::work& tx, const std::string& att, std::int64_t offset, std::string_view bytes) override;
    void read_into(pqxx::connection_base& c, const std::string& att, std::int64_t from, std::size_t max,
                   std::string& out) override;
    void drop(pqxx::work& tx, const std::string& att) override;
};

/// --attachments-dir: a file per upload in a directory every gateway
/// shares. Pieces go to `<att_id>.part` (truncated to the committed offset
/// first, so bytes of a piece whose transaction did not commit are
/// overwritten, then fdatasync'ed before the offset commits); a complete
/// upload is fsynced, renamed to `<att_id>` and the directory fsynced.
class DirBlobStore : public BlobStore {
public:
    /// Creates the directory when missing; throws when it cannot.
    explicit DirBlobStore(std::string dir);
    const char* kind() const override { return "dir"; }
    void write(pqxx::work& tx, const std::string& att, std::int64_t offset, std::string_view bytes) override;
    void read_into(pqxx::connection_base& c, const std::string& att, std::int64_t from, std::size_t max,
                   std::string& out) override;
    void drop(pqxx::work& tx, const std::string& att) override;
    void seal(const std::string& att) override;
    std::vector<std::string> files_older_than(std::int64_t min_age_ms) override;
    const std::string& dir() const { return dir_; }

private:
    std::string path(const std::string& att, bool partial) const;
    std::string dir_;
};

/// The uploads' rules. Each call is one or a few transactions on `c`; database
/// failures answer 503 UNAVAILABLE (nothing committed, or a retry is safe:
/// an append is judged by its offset).
class Attachments {
public:
    /// faults: the acceptance lab's rule.attachment_visibility (null: none).
    Attachments(BlobStore& blobs, std::int64_t max_bytes = default_max_attachment_bytes,
                FaultRegistry* faults = nullptr)
        : blobs_(blobs), max_bytes_(max_bytes), faults_(faults) {}

    BlobStore& blobs() { return blobs_; }
    /// The database workers of the attachment routes (--attachment-db-pool);
    /// null: they share the gateway's pool.
    void use_pool(DbPool* pool) { pool_ = pool; }
    DbPool* pool() const { return pool_; }
    /// The store of an upload's row (uploads.store): the configured one, or
    /// PostgreSQL for rows written before --attachments-dir was set.
    BlobStore& blobs_of(const std::string& kind) { return kind == blobs_.kind() ? blobs_ : pg_; }
    std::int64_t max_bytes() const { return max_bytes_; }

    /// The user of a device token (its SHA-256, hex), device not revoked;
    /// else 401 UNAUTHENTICATED.
    Att<std::string> user_of_token(pqxx::connection_base& c, const std::string& token_sha256_hex);
    /// A verified JWT's user and device (contract 4a): the device, when it
    /// exists, is the user's and not revoked; the user exists.
    Att<std::string> user_of_jwt(pqxx::connection_base& c, const std::string& user, const std::string& device);

    /// The backend API (uploads on a user's behalf, docs/protocol.md): the
    /// user exists (else 404 NOT_FOUND "no such user").
    Att<std::string> user_exists(pqxx::connection_base& c, const std::string& user);
    /// The backend API: the uploader of `att` (else 404, as for an unknown id).
    Att<std::string> owner_of(pqxx::connection_base& c, const std::string& att);
    /// The backend API's download: any complete upload (the backend reads
    /// every conversation); else 404.
    Att<UploadState> open_any(pqxx::connection_base& c, const std::string& att);

    /// POST /v1/uploads: 400 on a bad name, mime or sha256, 413 TOO_LARGE
    /// over max_bytes. A 0-byte upload is complete at once (or 422).
    Att<UploadState> create(pqxx::connection_base& c, const std::string& user, const std::string& name,
                            const std::string& mime, std::int64_t size, const std::string& sha256_hex);
    /// The caller's own upload; anyone else's, or an unknown id: 404.
    Att<UploadState> status(pqxx::connection_base& c, const std::string& user, const std::string& att);
    /// GET /v1/uploads/{id}: status(), and the lab's rule.attachment_resume.
    Att<UploadState> resume_status(pqxx::connection_base& c, const std::string& user, const std::string& att);
    /// Before a PUT's body is read: the upload is the caller's (404), not
    /// complete, `offset` is where it stands (409 OFFSET_MISMATCH with the
    /// offset) and `length` bytes fit its size (413 TOO_LARGE). `length`:
    /// the Content-Length, or -1 when chunked.
    Att<UploadState> check_put(pqxx::connection_base& c, const std::string& user, const std::string& att,
                               std::int64_t offset, std::int64_t length);
    /// Appends one piece at `offset`; the new offset. The same checks as
    /// check_put, judged on the row under its lock.
    Att<std::int64_t> append(pqxx::connection_base& c, const std::string& user, const std::string& att,
                             std::int64_t offset, std::string_view bytes);
    /// After the last byte: checks the size and the SHA-256 (streamed, piece
    /// by piece); a mismatch drops the bytes and answers 422 DIGEST_MISMATCH
    /// (the upload starts again at 0); a match makes it complete, durably
    /// (synchronous commit) before this returns.
    Att<UploadState> finish(pqxx::connection_base& c, const std::string& user, const std::string& att);
    /// DELETE /v1/uploads/{id} (docs/protocol.md): the caller's own upload,
    /// incomplete, or complete and referenced by no msg, goes with its bytes
    /// (the SDK's cancel of a pending file). Anyone else's, or an unknown id:
    /// 404 NOT_FOUND alike; referenced by a msg: 409 ATTACHMENT_IN_USE
    /// (nothing changes; its bytes go with the last msg that references it).
    /// A directory store's file is unlinked after the row's COMMIT (a kill in
    /// between leaves an orphan that sweep_orphans() removes).
    Att<UploadState> remove(pqxx::connection_base& c, const std::string& user, const std::string& att);
    /// GET /v1/attachments/{id}: a complete upload the caller uploaded, or
    /// referenced by a msg the caller may read (contract section 5); else 404.
    Att<UploadState> open(pqxx::connection_base& c, const std::string& user, const std::string& att);
    /// A piece of a complete upload's bytes (`kind`: its UploadState::store).
    std::string read(pqxx::connection_base& c, const std::string& kind, const std::string& att, std::int64_t from,
                     std::size_t max) {
        return blobs_of(kind).read(c, att, from, max);
    }
    /// read() into a buffer the caller turns over (BlobStore::read_into).
    void read_into(pqxx::connection_base& c, const std::string& kind, const std::string& att, std::int64_t from,
                   std::size_t max, std::string& out) {
        blobs_of(kind).read_into(c, att, from, max, out);
    }

    /// The collector (server.md: "Incomplete uploads, and complete ones no
    /// msg references, are removed after 24 h"): at most `batch` uploads
    /// whose last write (incomplete) or completion (unreferenced) is older
    /// than `after_ms`, each in its own transaction, rows locked SKIP LOCKED
    /// (gateways collect side by side). A referenced upload is never
    /// removed: event_attachments' key refuses the DELETE (a send that
    /// references it meanwhile wins). Bytes in a directory go after their
    /// row's COMMIT. Returns what went; call again until it returns none.
    struct Collected { long long uploads = 0, bytes = 0; };
    Collected collect(pqxx::connection_base& c, std::int64_t after_ms, int batch = 100);
    /// The directory store's orphans: a file whose upload row is gone (a
    /// gateway killed between a row's DELETE and its unlink, by the
    /// collector or DELETE /v1/uploads). A file is only ever written after
    /// its row committed, so a file without a row is garbage; files younger
    /// than `min_age_ms` are left for a later run all the same. Returns the
    /// files removed.
    long long sweep_orphans(pqxx::connection_base& c, std::int64_t min_age_ms);

    // Validation shared with the backend API (pure).
    static bool valid_name(std::string_view name);
    static bool valid_mime(std::string_view mime);
    static bool valid_sha256(std::string_view hex);
    static bool valid_att_id(std::string_view id); // a UUID in its canonical lowercase text form

    /// Counts each finish() that read the bytes back (no running digest
    /// for them): Metrics::attachment_digests_read_back.
    void count_read_backs(std::atomic<long long>* counter) { read_backs_ = counter; }

private:
    /// The SHA-256 of an upload's first `at` bytes, as this gateway's
    /// append() hashed them while writing, valid while the row's stamp is
    /// `stamp` (no write since, from any gateway). finish() takes it instead
    /// of reading the whole upload back; without one (another gateway wrote
    /// a piece, a restart, this process is new) it reads back as before.
    struct RunningDigest {
        std::int64_t at = 0;
        std::string stamp;
        std::shared_ptr<EVP_MD_CTX> md;
    };
    static constexpr std::size_t max_running_digests = 4096;
    std::shared_ptr<EVP_MD_CTX> digest_at(const std::string& att, std::int64_t offset, const std::string& stamp);
    void keep_digest(const std::string& att, std::int64_t at, std::string stamp, std::shared_ptr<EVP_MD_CTX> md);

    BlobStore& blobs_;
    PgBlobStore pg_;
    std::mutex digests_mu_;
    std::map<std::string, RunningDigest> digests_;
    std::atomic<long long>* read_backs_ = nullptr;
    DbPool* pool_ = nullptr;
    std::int64_t max_bytes_;
    FaultRegistry* faults_;
};

AttFailure att_not_found();

} // namespace im
