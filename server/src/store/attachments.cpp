// Attachments' SQL (attachments.hpp) and the PostgreSQL byte store.
#include "store/attachments.hpp"

#include "core/log.hpp"
#include "store/store_internal.hpp"

#include <libpq-fe.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <stdexcept>

#include <fcntl.h>
#include <unistd.h>

namespace im {

using namespace store_detail;

namespace {

const Statements& attachment_statements() {
    static const Statements table{
        {"im_att_token_user",
         "SELECT user_id FROM devices WHERE token_sha256 = decode($1, 'hex') AND revoked_at IS NULL"},
        {"im_att_jwt_user",
         "SELECT EXISTS (SELECT 1 FROM users WHERE user_id = $1) "
         "AND NOT EXISTS (SELECT 1 FROM devices WHERE device_id = $2 AND (user_id <> $1 OR revoked_at IS NOT NULL))"},
        {"im_att_create",
         "INSERT INTO uploads (att_id, owner_user, name, mime, size, sha256, store) "
         "VALUES (gen_random_uuid(), $1, $2, $3, $4, decode($5, 'hex'), $6) RETURNING att_id::text"},
        // Only the owner's row: another user's upload is as unknown as a missing one.
        {"im_att_state",
         "SELECT att_id::text, owner_user, name, mime, encode(sha256, 'hex'), size, received, complete, store, "
         "updated_at::text FROM uploads WHERE att_id = $1::uuid AND owner_user = $2"},
        {"im_att_state_lock",
         "SELECT att_id::text, owner_user, name, mime, encode(sha256, 'hex'), size, received, complete, store, "
         "updated_at::text FROM uploads WHERE att_id = $1::uuid AND owner_user = $2 FOR UPDATE"},
        // Its updated_at: the stamp of the running digest (Attachments::RunningDigest).
        {"im_att_advance",
         "UPDATE uploads SET received = received + $2, updated_at = now() WHERE att_id = $1::uuid "
         "RETURNING updated_at::text"},
        {"im_att_restart",
         "UPDATE uploads SET received = 0, updated_at = now() WHERE att_id = $1::uuid AND NOT complete"},
        {"im_att_complete",
         "UPDATE uploads SET complete = true, completed_at = now(), updated_at = now() "
         "WHERE att_id = $1::uuid AND received = size AND NOT complete RETURNING 1"},
        // Contract section 5 for a download: the uploader, or a reader of a
        // msg that references it (a period of the caller holds its seq).
        {"im_att_visible",
         "SELECT u.att_id::text, u.owner_user, u.name, u.mime, encode(u.sha256, 'hex'), u.size, u.received, "
         "u.complete, u.store FROM uploads u WHERE u.att_id = $1::uuid AND u.complete AND (u.owner_user = $2 "
         "OR EXISTS (SELECT 1 FROM event_attachments ea JOIN membership_periods m "
         "ON m.conv_id = ea.conv_id AND m.user_id = $2 AND m.from_seq <= ea.seq "
         "AND (m.to_seq IS NULL OR m.to_seq >= ea.seq) WHERE ea.att_id = u.att_id))"},
        // The lab's negative control rule.attachment_visibility: any complete upload.
        {"im_att_visible_any",
         "SELECT u.att_id::text, u.owner_user, u.name, u.mime, encode(u.sha256, 'hex'), u.size, u.received, "
         "u.complete, u.store FROM uploads u WHERE u.att_id = $1::uuid AND u.complete AND $2::text IS NOT NULL"},
        // The PostgreSQL store (its piece read is PgBlobStore::read's, in
        // binary form; it takes only the slices it needs of each row:
        // EXTERNAL storage, no decompression of the whole value).
        {"im_att_chunk_put", "INSERT INTO upload_chunks (att_id, off, len, data) VALUES ($1::uuid, $2, $3, $4)"},
        {"im_att_chunk_drop", "DELETE FROM upload_chunks WHERE att_id = $1::uuid"},
        // A piece of a PostgreSQL-store upload in one statement, one round
        // trip (Attachments::append): the row locked, judged (not complete,
        // at the offset, the bytes fit its size), the chunk inserted and the
        // offset moved, committed together by the statement's own
        // transaction; the row as it was, and its new stamp (NULL: nothing
        // written, the row says why).
        {"im_att_append_pg",
         "WITH cur AS (SELECT received, size, complete, store, updated_at::text AS stamp FROM uploads "
         "WHERE att_id = $1::uuid AND owner_user = $2 FOR UPDATE), "
         "ok AS (SELECT 1 FROM cur WHERE store = 'pg' AND NOT complete AND received = $3::bigint "
         "AND $4::bigint > 0 AND received + $4::bigint <= size), "
         "ins AS (INSERT INTO upload_chunks (att_id, off, len, data) SELECT $1::uuid, $3::bigint, $4::bigint, $5::bytea "
         "FROM ok RETURNING 1), "
         "adv AS (UPDATE uploads SET received = received + $4::bigint, updated_at = now() "
         "WHERE att_id = $1::uuid AND EXISTS (SELECT 1 FROM ok) RETURNING updated_at::text) "
         "SELECT received, size, complete, store, stamp, (SELECT updated_at FROM adv) FROM cur"},
        // The collector's candidates, oldest first; each is then judged again under its lock.
        {"im_att_stale",
         "(SELECT att_id::text FROM uploads WHERE NOT complete AND updated_at < now() - make_interval(secs => $1 / 1000.0) "
         "ORDER BY updated_at LIMIT $2) UNION ALL "
         "(SELECT u.att_id::text FROM uploads u WHERE u.complete AND u.completed_at < now() - make_interval(secs => $1 / 1000.0) "
         "AND NOT EXISTS (SELECT 1 FROM event_attachments ea WHERE ea.att_id = u.att_id) ORDER BY u.completed_at LIMIT $2)"},
        {"im_att_collect",
         "DELETE FROM uploads u WHERE u.att_id = $1::uuid AND u.updated_at < now() - make_interval(secs => $2 / 1000.0) "
         "AND (NOT u.complete OR NOT EXISTS (SELECT 1 FROM event_attachments ea WHERE ea.att_id = u.att_id)) "
         "RETURNING u.store, u.received"},
        // DELETE /v1/uploads/{id}: the caller's row (locked), whether a msg references it.
        {"im_att_remove_check",
         "SELECT EXISTS (SELECT 1 FROM event_attachments ea WHERE ea.att_id = $1::uuid)"},
        {"im_att_remove", "DELETE FROM uploads WHERE att_id = $1::uuid AND owner_user = $2"},
        {"im_att_user", "SELECT 1 FROM users WHERE user_id = $1"},
        {"im_att_owner", "SELECT owner_user FROM uploads WHERE att_id = $1::uuid"},
        {"im_att_known", "SELECT x::text FROM unnest($1::uuid[]) AS x WHERE EXISTS (SELECT 1 FROM uploads u WHERE u.att_id = x)"},
        {"im_att_lock_skip", "SELECT 1 FROM uploads WHERE att_id = $1::uuid FOR UPDATE SKIP LOCKED"},
    };
    return table;
}

void prepare(pqxx::connection_base& c) { prepare_all(c, attachment_statements()); }

UploadState state_of(const pqxx::row& r) {
    UploadState s;
    s.att_id = r[0].c_str();
    s.owner = r[1].c_str();
    s.name = r[2].c_str();
    s.mime = r[3].c_str();
    s.sha256 = r[4].c_str();
    s.size = r[5].as<std::int64_t>();
    s.received = r[6].as<std::int64_t>();
    s.complete = r[7].as<bool>();
    s.store = r[8].c_str();
    if (r.size() > 9) s.stamp = r[9].c_str();
    return s;
}

AttFailure fail(unsigned status, std::string code, std::string message) {
    return AttFailure{status, std::move(code), std::move(message), std::nullopt};
}

AttFailure att_unavailable() { return fail(503, "UNAVAILABLE", "service unavailable, retry"); }

/// Database failures: 503 (nothing was committed, or the offset makes a retry safe).
template <class T, class F>
Att<T> guarded_att(const char* what, F&& f) {
    try {
        return f();
    } catch (const pqxx::sql_error& e) {
        log_warn("db_error", {{"op", what}, {"sqlstate", e.sqlstate()}, {"err", e.what()}});
        return att_unavailable();
    } catch (const std::exception& e) {
        log_warn("db_error", {{"op", what}, {"err", e.what()}});
        return att_unavailable();
    }
}

bool is_hex(char ch) { return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'); }

std::string lower(std::string s) {
    for (auto& ch : s)
        if (ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch - 'A' + 'a');
    return s;
}

// The checks of a PUT on the row `s` (the caller's).
std::optional<AttFailure> put_refusal(const UploadState& s, std::int64_t offset, std::int64_t length) {
    if (s.complete) {
        AttFailure f = fail(409, "OFFSET_MISMATCH", "the upload is complete");
        f.offset = s.received;
        return f;
    }
    if (offset != s.received) {
        AttFailure f = fail(409, "OFFSET_MISMATCH", "the upload stands at another offset");
        f.offset = s.received;
        return f;
    }
    if (length > 0 && s.received + length > s.size)
        return fail(413, "TOO_LARGE", "more bytes than the upload's declared size");
    return std::nullopt;
}

} // namespace

AttFailure att_not_found() { return fail(404, "NOT_FOUND", "no such upload"); }

// ---------------------------------------------------------------- the PostgreSQL store

void PgBlobStore::write(pqxx::work& tx, const std::string& att, std::int64_t offset, std::string_view bytes) {
    prepare(tx.conn());
    tx.exec_prepared("im_att_chunk_put", att, offset, static_cast<std::int64_t>(bytes.size()),
                     pqxx::binarystring(bytes.data(), bytes.size()));
}

namespace {

// libpqxx 6 gives its libpq handle to large objects only, through a
// transaction; a subclass may ask for it (as db_pool.cpp's watchdog does).
struct RawConnection : pqxx::largeobject {
    static PGconn* of(const pqxx::dbtransaction& tx) { return raw_connection(tx); }
};

// A transaction object that never sends BEGIN: it is only there so that
// RawConnection can hand out libpq's handle, for one statement run in
// autocommit (its own single-statement transaction). A piece read is then
// one round trip instead of BEGIN, SELECT and ROLLBACK: each is a wake-up
// of the backend and of the worker, which under load costs more than the
// read itself (docs/benchmarks.md).
class Autocommit : public pqxx::dbtransaction {
public:
    explicit Autocommit(pqxx::connection_base& c) : pqxx::internal::namedclass{"autocommit"}, pqxx::dbtransaction(c, true) {}
    ~Autocommit() override { End(); } // never begun: only unregisters it from the connection

private:
    void do_commit() override {}
};

} // namespace

void PgBlobStore::read_into(pqxx::connection_base& c, const std::string& att, std::int64_t from, std::size_t max,
                            std::string& out) {
    Autocommit tx(c);
    // The piece in binary form: libpqxx 6 asks for text results only, and a
    // bytea in text is hex, twice its size, encoded by the backend and
    // decoded here (PQunescapeBytea): the PostgreSQL store's download cost
    // in the profile (docs/benchmarks.md). libpq itself takes a result
    // format, so the one statement goes through it on the transaction's
    // connection.
    PGconn* raw = RawConnection::of(tx);
    if (!raw) throw std::runtime_error("no libpq connection");
    const std::string from_text = std::to_string(from), max_text = std::to_string(max);
    const char* values[] = {att.c_str(), from_text.c_str(), max_text.c_str()};
    std::unique_ptr<PGresult, decltype(&PQclear)> r(
        PQexecParams(raw,
                     "SELECT off, substring(data FROM (greatest($2::bigint - off, 0) + 1)::integer FOR $3::integer) "
                     "FROM upload_chunks WHERE att_id = $1::uuid AND off < $2::bigint + $3::bigint "
                     "AND off + len > $2::bigint ORDER BY off",
                     3, nullptr, values, nullptr, nullptr, /*resultFormat=*/1),
        &PQclear);
    if (!r || PQresultStatus(r.get()) != PGRES_TUPLES_OK) {
        const std::string err = r ? PQresultErrorMessage(r.get()) : PQerrorMessage(raw);
        throw std::runtime_error("reading a piece: " + err);
    }
    out.clear(); // its capacity stays
    const int rows = PQntuples(r.get());
    for (int i = 0; i < rows && out.size() < max; ++i)
        out.append(PQgetvalue(r.get(), i, 1), static_cast<std::size_t>(PQgetlength(r.get(), i, 1)));
    if (out.size() > max) out.resize(max);
}

void PgBlobStore::drop(pqxx::work& tx, const std::string& att) {
    prepare(tx.conn());
    tx.exec_prepared("im_att_chunk_drop", att);
}

// ---------------------------------------------------------------- the directory store

namespace {

[[noreturn]] void io_error(const std::string& what, const std::string& path) {
    throw std::runtime_error(what + " " + path + ": " + std::strerror(errno));
}

struct Fd {
    int fd = -1;
    ~Fd() {
        if (fd >= 0) ::close(fd);
    }
};

void fsync_dir(const std::string& dir) {
    Fd d{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
    if (d.fd < 0) io_error("open", dir);
    if (::fsync(d.fd) != 0) io_error("fsync", dir);
}

} // namespace

DirBlobStore::DirBlobStore(std::string dir) : dir_(std::move(dir)) {
    while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec || !std::filesystem::is_directory(dir_))
        throw std::runtime_error("--attachments-dir " + dir_ + ": not a directory we can create (" + ec.message() + ")");
}

std::string DirBlobStore::path(const std::string& att, bool partial) const {
    return dir_ + "/" + att + (partial ? ".part" : "");
}

void DirBlobStore::write(pqxx::work&, const std::string& att, std::int64_t offset, std::string_view bytes) {
    const auto p = path(att, true);
    Fd f{::open(p.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0640)};
    if (f.fd < 0) io_error("open", p);
    // Bytes past the committed offset are a piece whose transaction did not commit.
    if (::ftruncate(f.fd, offset) != 0) io_error("truncate", p);
    std::size_t done = 0;
    while (done < bytes.size()) {
        const auto n = ::pwrite(f.fd, bytes.data() + done, bytes.size() - done, offset + static_cast<off_t>(done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) io_error("write", p);
        done += static_cast<std::size_t>(n);
    }
    // On disk before the offset that counts it commits.
    if (::fdatasync(f.fd) != 0) io_error("fdatasync", p);
    if (offset == 0) fsync_dir(dir_); // the new name too
}

void DirBlobStore::read_into(pqxx::connection_base&, const std::string& att, std::int64_t from, std::size_t max,
                             std::string& out) {
    auto p = path(att, false);
    Fd f{::open(p.c_str(), O_RDONLY | O_CLOEXEC)};
    if (f.fd < 0 && errno == ENOENT) {
        p = path(att, true); // not sealed yet: the digest check reads the partial file
        f.fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    }
    if (f.fd < 0) {
        out.clear();
        if (errno == ENOENT) return;
        io_error("open", p);
    }
    out.resize(max); // no zeroing when a buffer turned over is that long already
    std::size_t got = 0;
    while (got < max) {
        const auto n = ::pread(f.fd, out.data() + got, max - got, from + static_cast<off_t>(got));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) io_error("read", p);
        if (n == 0) break;
        got += static_cast<std::size_t>(n);
    }
    out.resize(got);
}

void DirBlobStore::drop(pqxx::work&, const std::string& att) {
    for (bool partial : {true, false}) {
        const auto p = path(att, partial);
        if (::unlink(p.c_str()) != 0 && errno != ENOENT) io_error("unlink", p);
    }
}

void DirBlobStore::seal(const std::string& att) {
    const auto from = path(att, true), to = path(att, false);
    if (!std::filesystem::exists(from) && std::filesystem::exists(to)) return; // sealed already (a retried finish)
    {
        // O_CREAT: a 0-byte upload never wrote a piece.
        Fd f{::open(from.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0640)};
        if (f.fd < 0) io_error("open", from);
        if (::fsync(f.fd) != 0) io_error("fsync", from);
    }
    if (::rename(from.c_str(), to.c_str()) != 0) io_error("rename", from);
    fsync_dir(dir_);
}

std::vector<std::string> DirBlobStore::files_older_than(std::int64_t min_age_ms) {
    std::vector<std::string> out;
    const auto now = std::filesystem::file_time_type::clock::now();
    std::error_code ec;
    for (std::filesystem::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
        std::string name = it->path().filename().string();
        if (name.size() > 5 && name.compare(name.size() - 5, 5, ".part") == 0) name.resize(name.size() - 5);
        if (!Attachments::valid_att_id(name)) continue; // not ours
        std::error_code tec;
        const auto mtime = std::filesystem::last_write_time(it->path(), tec);
        if (tec) continue; // gone meanwhile
        if (now - mtime < std::chrono::milliseconds(min_age_ms)) continue;
        out.push_back(std::move(name));
    }
    return out;
}

// ---------------------------------------------------------------- validation

bool Attachments::valid_name(std::string_view name) {
    if (name.empty() || name.size() > 255) return false;
    // UTF-8, well formed, without '/', '\' or control characters (C0, DEL, C1).
    std::size_t i = 0;
    while (i < name.size()) {
        const auto b = static_cast<unsigned char>(name[i]);
        std::uint32_t cp = 0;
        std::size_t len = 0;
        if (b < 0x80) cp = b, len = 1;
        else if ((b & 0xE0) == 0xC0) cp = b & 0x1F, len = 2;
        else if ((b & 0xF0) == 0xE0) cp = b & 0x0F, len = 3;
        else if ((b & 0xF8) == 0xF0) cp = b & 0x07, len = 4;
        else return false;
        if (i + len > name.size()) return false;
        for (std::size_t k = 1; k < len; ++k) {
            const auto cb = static_cast<unsigned char>(name[i + k]);
            if ((cb & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (cb & 0x3F);
        }
        static constexpr std::uint32_t min_of[] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min_of[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false; // overlong, surrogate
        if (cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp <= 0x9F) || cp == '/' || cp == '\\') return false;
        i += len;
    }
    return true;
}

bool Attachments::valid_mime(std::string_view mime) {
    // type "/" subtype, each an RFC 9110 token; no parameters.
    auto tchar = [](char ch) {
        return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
               std::string_view("!#$%&'*+-.^_`|~").find(ch) != std::string_view::npos;
    };
    if (mime.size() > 255) return false;
    const auto slash = mime.find('/');
    if (slash == std::string_view::npos || slash == 0 || slash + 1 == mime.size()) return false;
    for (std::size_t i = 0; i < mime.size(); ++i)
        if (i != slash && !tchar(mime[i])) return false;
    return true;
}

bool Attachments::valid_sha256(std::string_view hex) {
    if (hex.size() != 64) return false;
    for (char ch : hex)
        if (!is_hex(ch) && !(ch >= 'A' && ch <= 'F')) return false;
    return true;
}

bool Attachments::valid_att_id(std::string_view id) {
    if (id.size() != 36) return false;
    for (std::size_t i = 0; i < id.size(); ++i) {
        if (i == 8 || i == 13 || i == 18 || i == 23) {
            if (id[i] != '-') return false;
        } else if (!is_hex(id[i])) {
            return false;
        }
    }
    return true;
}

// ---------------------------------------------------------------- the rules

Att<std::string> Attachments::user_of_token(pqxx::connection_base& c, const std::string& token_sha256_hex) {
    return guarded_att<std::string>("att_auth", [&]() -> Att<std::string> {
        prepare(c);
        pqxx::read_transaction tx(c);
        auto r = tx.exec_prepared("im_att_token_user", token_sha256_hex);
        if (r.empty()) return fail(401, "UNAUTHENTICATED", "unknown or revoked device token");
        return std::string(r[0][0].c_str());
    });
}

Att<std::string> Attachments::user_of_jwt(pqxx::connection_base& c, const std::string& user,
                                          const std::string& device) {
    return guarded_att<std::string>("att_auth", [&]() -> Att<std::string> {
        prepare(c);
        pqxx::read_transaction tx(c);
        auto r = tx.exec_prepared("im_att_jwt_user", user, device);
        if (r.empty() || !r[0][0].as<bool>()) return fail(401, "UNAUTHENTICATED", "unknown user or device");
        return user;
    });
}

Att<std::string> Attachments::user_exists(pqxx::connection_base& c, const std::string& user) {
    return guarded_att<std::string>("att_user", [&]() -> Att<std::string> {
        prepare(c);
        pqxx::read_transaction tx(c);
        if (tx.exec_prepared("im_att_user", user).empty()) return fail(404, "NOT_FOUND", "no such user");
        return user;
    });
}

Att<std::string> Attachments::owner_of(pqxx::connection_base& c, const std::string& att) {
    if (!valid_att_id(att)) return att_not_found();
    return guarded_att<std::string>("att_owner", [&]() -> Att<std::string> {
        prepare(c);
        pqxx::read_transaction tx(c);
        auto r = tx.exec_prepared("im_att_owner", att);
        if (r.empty()) return att_not_found();
        return std::string(r[0][0].c_str());
    });
}

Att<UploadState> Attachments::open_any(pqxx::connection_base& c, const std::string& att) {
    if (!valid_att_id(att)) return att_not_found();
    return guarded_att<UploadState>("att_open", [&]() -> Att<UploadState> {
        prepare(c);
        pqxx::read_transaction tx(c);
        auto r = tx.exec_prepared("im_att_visible_any", att, std::string("backend"));
        if (r.empty()) return att_not_found();
        return state_of(r[0]);
    });
}

Att<UploadState> Attachments::create(pqxx::connection_base& c, const std::string& user, const std::string& name,
                                     const std::string& mime, std::int64_t size, const std::string& sha256_hex) {
    if (!valid_name(name))
        return fail(400, "INVALID_ARGUMENT", "name: 1-255 bytes of UTF-8 without '/', '\\' or control characters");
    if (!valid_mime(mime)) return fail(400, "INVALID_ARGUMENT", "mime: a type/subtype token");
    if (!valid_sha256(sha256_hex)) return fail(400, "INVALID_ARGUMENT", "sha256: 64 hex digits");
    if (size < 0) return fail(400, "INVALID_ARGUMENT", "size: a non-negative integer");
    if (size > max_bytes_)
        return fail(413, "TOO_LARGE", "larger than the server's limit of " + std::to_string(max_bytes_) + " bytes");
    auto made = guarded_att<UploadState>("att_create", [&]() -> Att<UploadState> {
        prepare(c);
        pqxx::work tx(c);
        auto r = tx.exec_prepared("im_att_create", user, name, mime, size, lower(sha256_hex), blobs_.kind());
        tx.commit();
        UploadState s{r[0][0].c_str(), user, name, mime, lower(sha256_hex), size, 0, false, blobs_.kind(), {}};
        return s;
    });
    if (!att_ok(made) || size > 0) return made;
    return finish(c, user, std::get<UploadState>(made).att_id);
}

Att<UploadState> Attachments::status(pqxx::connection_base& c, const std::string& user, const std::string& att) {
    if (!valid_att_id(att)) return att_not_found();
    return guarded_att<UploadState>("att_status", [&]() -> Att<UploadState> {
        prepare(c);
        pqxx::read_transaction tx(c);
        auto r = tx.exec_prepared("im_att_state", att, user);
        if (r.empty()) return att_not_found();
        return state_of(r[0]);
    });
}

Att<UploadState> Attachments::resume_status(pqxx::connection_base& c, const std::string& user, const std::string& att) {
    auto st = status(c, user, att);
    // The lab's negative control rule.attachment_resume: a server that
    // restarts an interrupted upload at 0 (its pieces dropped).
    if (!att_ok(st) || !faults_ || std::get<UploadState>(st).complete || std::get<UploadState>(st).received == 0 ||
        !faults_->broken("rule.attachment_resume"))
        return st;
    return guarded_att<UploadState>("att_status", [&]() -> Att<UploadState> {
        pqxx::work tx(c);
        auto r = tx.exec_prepared("im_att_state_lock", att, user);
        if (r.empty()) return att_not_found();
        auto s = state_of(r[0]);
        if (s.complete) return s;
        blobs_of(s.store).drop(tx, att);
        tx.exec_prepared("im_att_restart", att);
        tx.commit();
        s.received = 0;
        return s;
    });
}

Att<UploadState> Attachments::check_put(pqxx::connection_base& c, const std::string& user, const std::string& att,
                                        std::int64_t offset, std::int64_t length) {
    auto s = status(c, user, att);
    if (!att_ok(s)) return s;
    if (auto f = put_refusal(std::get<UploadState>(s), offset, length)) return *f;
    return s;
}

Att<std::int64_t> Attachments::append(pqxx::connection_base& c, const std::string& user, const std::string& att,
                                      std::int64_t offset, std::string_view bytes) {
    if (!valid_att_id(att)) return att_not_found();
    // The PostgreSQL store: one statement instead of BEGIN, the row's lock,
    // the chunk, the offset and COMMIT (five round trips a piece, each a
    // wake-up of the backend and of this worker: under load, the upload's
    // cost). The same checks, the same transaction, the same durability
    // (the pool's sessions commit with synchronous_commit on).
    if (std::string_view(blobs_.kind()) == "pg" && !bytes.empty()) {
        auto one = guarded_att<std::optional<std::int64_t>>("att_append", [&]() -> Att<std::optional<std::int64_t>> {
            prepare(c);
            pqxx::nontransaction tx(c);
            const auto len = static_cast<std::int64_t>(bytes.size());
            auto r = tx.exec_prepared("im_att_append_pg", att, user, offset, len,
                                      pqxx::binarystring(bytes.data(), bytes.size()));
            if (r.empty()) return att_not_found();
            const auto& row = r[0];
            if (row[5].is_null()) {
                UploadState was;
                was.received = row[0].as<std::int64_t>();
                was.size = row[1].as<std::int64_t>();
                was.complete = row[2].as<bool>();
                if (auto f = put_refusal(was, offset, len)) return *f;
                return std::optional<std::int64_t>{}; // a row of another store: the general path
            }
            // Written: the running digest goes on when the row's stamp
            // before this piece is the one our last piece left.
            auto md = digest_at(att, offset, row[4].c_str());
            if (md && EVP_DigestUpdate(md.get(), bytes.data(), bytes.size()) != 1) md.reset();
            keep_digest(att, offset + len, row[5].c_str(), std::move(md));
            return std::optional<std::int64_t>{offset + len};
        });
        if (auto* f = std::get_if<AttFailure>(&one)) return *f;
        if (auto to = std::get<std::optional<std::int64_t>>(one)) return *to;
    }
    return guarded_att<std::int64_t>("att_append", [&]() -> Att<std::int64_t> {
        prepare(c);
        pqxx::work tx(c);
        auto r = tx.exec_prepared("im_att_state_lock", att, user);
        if (r.empty()) return att_not_found();
        const auto s = state_of(r[0]);
        if (auto f = put_refusal(s, offset, static_cast<std::int64_t>(bytes.size()))) return *f;
        if (bytes.empty()) return s.received;
        // The running digest: the bytes before `offset` hashed on this
        // gateway, and nobody wrote since (the row's stamp is the one our
        // last append left), or nothing before it.
        auto md = digest_at(att, offset, s.stamp);
        if (md && EVP_DigestUpdate(md.get(), bytes.data(), bytes.size()) != 1) md.reset();
        blobs_of(s.store).write(tx, att, offset, bytes);
        auto adv = tx.exec_prepared("im_att_advance", att, static_cast<std::int64_t>(bytes.size()));
        tx.commit();
        const std::int64_t to = offset + static_cast<std::int64_t>(bytes.size());
        keep_digest(att, to, adv.empty() ? std::string() : std::string(adv[0][0].c_str()), std::move(md));
        return to;
    });
}

std::shared_ptr<EVP_MD_CTX> Attachments::digest_at(const std::string& att, std::int64_t offset,
                                                   const std::string& stamp) {
    std::shared_ptr<EVP_MD_CTX> md(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
    if (!md) return nullptr;
    if (offset == 0) {
        if (EVP_DigestInit_ex(md.get(), EVP_sha256(), nullptr) != 1) return nullptr;
        return md;
    }
    std::lock_guard lk(digests_mu_);
    auto it = digests_.find(att);
    if (it == digests_.end() || it->second.at != offset || it->second.stamp != stamp || stamp.empty()) return nullptr;
    if (EVP_MD_CTX_copy_ex(md.get(), it->second.md.get()) != 1) return nullptr;
    return md;
}

void Attachments::keep_digest(const std::string& att, std::int64_t at, std::string stamp,
                              std::shared_ptr<EVP_MD_CTX> md) {
    std::lock_guard lk(digests_mu_);
    if (!md || stamp.empty()) {
        digests_.erase(att);
        return;
    }
    // Abandoned uploads leave theirs: a bounded map, emptied when full (an
    // upload without one is read back at its end, as before).
    if (digests_.size() >= max_running_digests && !digests_.count(att)) digests_.clear();
    digests_[att] = RunningDigest{at, std::move(stamp), std::move(md)};
}

Att<UploadState> Attachments::finish(pqxx::connection_base& c, const std::string& user, const std::string& att) {
    auto st = status(c, user, att);
    if (!att_ok(st)) return st;
    auto s = std::get<UploadState>(st);
    if (s.complete || s.received != s.size) return s;
    // The digest: the running one when every byte since the last write
    // anywhere went through this gateway's append() in order (the row's
    // stamp says nobody wrote since), else the bytes read back piece by
    // piece (never the whole file in memory).
    std::shared_ptr<EVP_MD_CTX> md;
    std::int64_t at = 0;
    {
        std::lock_guard lk(digests_mu_);
        auto it = digests_.find(att);
        if (it != digests_.end()) {
            if (it->second.at == s.size && it->second.stamp == s.stamp && !s.stamp.empty()) {
                md = std::move(it->second.md);
                at = s.size;
            }
            digests_.erase(it);
        }
    }
    if (!md) {
        if (read_backs_ && s.size > 0) ++*read_backs_;
        md.reset(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
        if (!md || EVP_DigestInit_ex(md.get(), EVP_sha256(), nullptr) != 1) return att_unavailable();
    }
    auto scanned = guarded_att<bool>("att_digest", [&]() -> Att<bool> {
        while (at < s.size) {
            auto piece = blobs_of(s.store).read(c, att, at, attachment_piece_bytes);
            if (piece.empty()) break; // fewer bytes than counted: a mismatch below
            EVP_DigestUpdate(md.get(), piece.data(), piece.size());
            at += static_cast<std::int64_t>(piece.size());
        }
        return true;
    });
    if (!att_ok(scanned)) return std::get<AttFailure>(scanned);
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    EVP_DigestFinal_ex(md.get(), digest, &len);
    static const char* hex = "0123456789abcdef";
    std::string got;
    for (unsigned i = 0; i < len; ++i) {
        got += hex[digest[i] >> 4];
        got += hex[digest[i] & 15];
    }
    const bool match = at == s.size && got == s.sha256;
    if (match) {
        try {
            blobs_of(s.store).seal(att);
        } catch (const std::exception& e) {
            log_warn("att_seal_failed", {{"att", att}, {"err", e.what()}});
            return att_unavailable();
        }
    }
    return guarded_att<UploadState>("att_finish", [&]() -> Att<UploadState> {
        prepare(c);
        pqxx::work tx(c);
        auto r = tx.exec_prepared("im_att_state_lock", att, user);
        if (r.empty()) return att_not_found();
        auto now = state_of(r[0]);
        if (now.complete) return now; // a concurrent finish won
        if (!match) {
            blobs_of(now.store).drop(tx, att);
            tx.exec_prepared("im_att_restart", att);
            tx.commit();
            log_info("att_digest_mismatch", {{"att", att}, {"user", user}});
            AttFailure f = fail(422, "DIGEST_MISMATCH", "the bytes do not match the declared size and sha256; "
                                                        "the upload starts again at offset 0");
            f.offset = 0;
            return f;
        }
        // Durable before `complete` is answered, whatever the session's
        // synchronous_commit (the gateway's sessions run with it off).
        tx.exec0("SET LOCAL synchronous_commit = on");
        tx.exec_prepared("im_att_complete", att);
        tx.commit();
        now.complete = true;
        return now;
    });
}

Attachments::Collected Attachments::collect(pqxx::connection_base& c, std::int64_t after_ms, int batch) {
    Collected out;
    prepare(c);
    std::vector<std::string> ids;
    {
        pqxx::read_transaction tx(c);
        for (const auto& r : tx.exec_prepared("im_att_stale", after_ms, batch)) ids.emplace_back(r[0].c_str());
    }
    for (const auto& att : ids) {
        try {
            pqxx::work tx(c);
            if (tx.exec_prepared("im_att_lock_skip", att).empty()) continue; // busy: the next run
            auto r = tx.exec_prepared("im_att_collect", att, after_ms);
            if (r.empty()) continue; // written to, or referenced, since
            const std::string kind = r[0][0].c_str();
            const auto bytes = r[0][1].as<long long>();
            // The PostgreSQL store's chunks go with the row (ON DELETE CASCADE).
            tx.commit();
            if (kind != "pg" && kind == blobs_.kind()) {
                pqxx::work none(c); // drop() takes a transaction; the directory store does not use it
                blobs_.drop(none, att);
            }
            ++out.uploads;
            out.bytes += bytes;
            log_info("attachment_collected", {{"att", att}, {"bytes", std::to_string(bytes)}});
        } catch (const pqxx::foreign_key_violation&) {
            // A msg references it now: it stays.
        } catch (const std::exception& e) {
            log_warn("attachment_gc_failed", {{"att", att}, {"err", e.what()}});
        }
    }
    return out;
}

Att<UploadState> Attachments::remove(pqxx::connection_base& c, const std::string& user, const std::string& att) {
    if (!valid_att_id(att)) return att_not_found();
    auto gone = guarded_att<UploadState>("att_remove", [&]() -> Att<UploadState> {
        prepare(c);
        pqxx::work tx(c);
        auto r = tx.exec_prepared("im_att_state_lock", att, user);
        if (r.empty()) return att_not_found();
        auto s = state_of(r[0]);
        // A send that references it holds the row (FOR KEY SHARE) until it
        // commits: the lock above waited for it, so the reference is seen.
        if (tx.exec_prepared("im_att_remove_check", att)[0][0].as<bool>())
            return fail(409, "ATTACHMENT_IN_USE", "a message references this attachment; it stays while one does");
        // The PostgreSQL store's chunks go with the row (ON DELETE CASCADE).
        tx.exec_prepared("im_att_remove", att, user);
        tx.commit();
        return s;
    });
    if (!att_ok(gone)) return gone;
    const auto& s = std::get<UploadState>(gone);
    if (s.store != "pg" && s.store == blobs_.kind()) {
        try {
            pqxx::work none(c); // drop() takes a transaction; the directory store does not use it
            blobs_.drop(none, att);
        } catch (const std::exception& e) {
            // The row is gone: the orphan sweep removes the file later.
            log_warn("att_unlink_failed", {{"att", att}, {"err", e.what()}});
        }
    }
    log_info("upload_removed", {{"att", att}, {"user", user}, {"received", std::to_string(s.received)}});
    return gone;
}

long long Attachments::sweep_orphans(pqxx::connection_base& c, std::int64_t min_age_ms) {
    if (std::string_view(blobs_.kind()) == "pg") return 0;
    auto files = blobs_.files_older_than(min_age_ms);
    if (files.empty()) return 0;
    prepare(c);
    long long removed = 0;
    for (std::size_t at = 0; at < files.size(); at += 500) {
        const std::size_t n = std::min<std::size_t>(500, files.size() - at);
        std::string list = "{";
        for (std::size_t i = 0; i < n; ++i) list += (i ? "," : "") + files[at + i];
        list += "}";
        std::vector<std::string> known;
        {
            pqxx::read_transaction tx(c);
            for (const auto& r : tx.exec_prepared("im_att_known", list)) known.emplace_back(r[0].c_str());
        }
        for (std::size_t i = 0; i < n; ++i) {
            const auto& att = files[at + i];
            if (std::find(known.begin(), known.end(), att) != known.end()) continue;
            try {
                pqxx::work none(c); // drop() takes a transaction; the directory store does not use it
                blobs_.drop(none, att);
                ++removed;
                log_info("attachment_orphan_removed", {{"att", att}});
            } catch (const std::exception& e) {
                log_warn("attachment_gc_failed", {{"att", att}, {"err", e.what()}});
            }
        }
    }
    return removed;
}

Att<UploadState> Attachments::open(pqxx::connection_base& c, const std::string& user, const std::string& att) {
    if (!valid_att_id(att)) return att_not_found();
    return guarded_att<UploadState>("att_open", [&]() -> Att<UploadState> {
        prepare(c);
        pqxx::read_transaction tx(c);
        const bool broken = faults_ && faults_->broken("rule.attachment_visibility");
        auto r = tx.exec_prepared(broken ? "im_att_visible_any" : "im_att_visible", att, user);
        if (r.empty()) return att_not_found();
        return state_of(r[0]);
    });
}

} // namespace im
