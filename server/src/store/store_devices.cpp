// The store's devices: hello (random and signed tokens, the install rule),
// the operator commands on users, devices and tokens, and the backend API's
// keys and per-user devices. The admin CLI and the backend API reach the
// operator commands through the same functions (provisioning.hpp).
#include "store/store_internal.hpp"

#include <openssl/crypto.h>

namespace im {

using namespace store_detail;

namespace {

// Every statement of this part, prepared per connection (prepare_all).
const Statements& devices_statements() {
    static const Statements table{
        // hello: the device of a token, held FOR UPDATE only when this hello
        // writes a new install; a known install holds it FOR SHARE, like a
        // send, so a reconnect never waits for (nor holds up) the device's
        // requests. Each behind the device's gate, exclusive or shared as
        // its row lock (schema/functions/im_device_gate.sql): a new install
        // is not starved by the older install's requests either. Whether the install is known is read first, unlocked;
        // the rule is then judged under the lock (installs are never deleted).
        {"im_hello_known",
         "SELECT 1 FROM devices d JOIN device_installs i ON i.device_id = d.device_id "
         "WHERE d.token_sha256 = decode($1, 'hex') AND i.install_id = $2"},
        {"im_hello_device",
         "SELECT device_id, user_id FROM devices WHERE token_sha256 = decode($1, 'hex') AND revoked_at IS NULL "
         "AND im_device_gate_exclusive(device_id) FOR UPDATE"},
        {"im_hello_device_share",
         "SELECT device_id, user_id FROM devices WHERE token_sha256 = decode($1, 'hex') AND revoked_at IS NULL "
         "AND im_device_gate_shared(device_id) FOR SHARE"},
        // hello with a JWT: the device is created on its first hello, with a
        // token hash of a random secret nobody holds.
        {"im_jwt_device_add",
         "INSERT INTO devices (device_id, user_id, token_sha256) VALUES ($1, $2, decode($3, 'hex')) "
         "ON CONFLICT (device_id) DO NOTHING"},
        {"im_jwt_known", "SELECT 1 FROM device_installs WHERE device_id = $1 AND install_id = $2"},
        {"im_jwt_device",
         "SELECT user_id, revoked_at IS NOT NULL, encode(token_sha256, 'hex') FROM devices WHERE device_id = $1 "
         "AND im_device_gate_exclusive($1) FOR UPDATE"},
        {"im_jwt_device_share",
         "SELECT user_id, revoked_at IS NOT NULL, encode(token_sha256, 'hex') FROM devices WHERE device_id = $1 "
         "AND im_device_gate_shared($1) FOR SHARE"},
        // The install rule: a known install, superseded or not.
        {"im_install", "SELECT superseded_at IS NOT NULL FROM device_installs WHERE device_id = $1 AND install_id = $2"},
        // A new install supersedes every older one of the device.
        {"im_install_add",
         "WITH s AS (UPDATE device_installs SET superseded_at = now() "
         "           WHERE device_id = $1 AND superseded_at IS NULL), "
         "i AS (INSERT INTO device_installs (device_id, install_id) VALUES ($1, $2)) "
         "UPDATE devices SET current_install = $2 WHERE device_id = $1"},
        {"im_user_exists", "SELECT 1 FROM users WHERE user_id = $1"},
        {"im_user_add", "INSERT INTO users (user_id) VALUES ($1) ON CONFLICT DO NOTHING RETURNING 1"},
        {"im_device_exists", "SELECT 1 FROM devices WHERE device_id = $1"},
        {"im_device_add", "INSERT INTO devices (device_id, user_id, token_sha256) VALUES ($1, $2, decode($3, 'hex'))"},
        // A new token and a revocation take the device's gate exclusive
        // first: the requests already judged on the row finish, the later
        // ones queue behind (schema/functions/im_device_gate.sql).
        {"im_token_reissue",
         "UPDATE devices SET token_sha256 = decode($2, 'hex'), revoked_at = NULL WHERE device_id = $1 "
         "AND im_device_gate_exclusive($1) RETURNING 1"},
        {"im_device_revoke",
         "UPDATE devices SET revoked_at = now() WHERE device_id = $1 AND im_device_gate_exclusive($1) RETURNING 1"},
        {"im_token_valid",
         "SELECT 1 FROM devices WHERE device_id = $1 AND revoked_at IS NULL AND token_sha256 = decode($2, 'hex')"},
        // Backend API keys (only their SHA-256 is kept).
        {"im_api_key_add",
         "INSERT INTO api_keys (name, key_id, key_sha256, scope) VALUES ($1, $2, decode($3, 'hex'), $4) "
         "ON CONFLICT (name) DO NOTHING RETURNING 1"},
        {"im_api_key_revoke",
         "UPDATE api_keys SET revoked_at = coalesce(revoked_at, now()) WHERE name = $1 RETURNING 1"},
        {"im_api_keys",
         "SELECT name, scope, to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), "
         "coalesce(to_char(revoked_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), '') "
         "FROM api_keys ORDER BY name"},
        {"im_api_key", "SELECT name, scope, encode(key_sha256, 'hex') FROM api_keys WHERE key_id = $1 AND revoked_at IS NULL"},
        {"im_conv_exists", "SELECT 1 FROM conversations WHERE conv_id = $1"},
        // The backend API's hidden device of a user: made on first use; a
        // revocation of it (no caller can name it) is undone.
        {"im_backend_sender",
         "WITH ins AS (INSERT INTO devices (device_id, user_id, token_sha256) "
         "  SELECT $1, $2, decode($3, 'hex') WHERE EXISTS (SELECT 1 FROM users WHERE user_id = $2) "
         "  ON CONFLICT (device_id) DO UPDATE SET revoked_at = NULL WHERE devices.revoked_at IS NOT NULL "
         "  RETURNING encode(token_sha256, 'hex')) "
         "SELECT * FROM ins UNION ALL "
         "SELECT encode(token_sha256, 'hex') FROM devices WHERE device_id = $1 AND user_id = $2 AND revoked_at IS NULL"},
    };
    return table;
}

void prepare_devices(pqxx::connection_base& c) { prepare_all(c, devices_statements()); }

// The install rule of section 4 for a device proved at hello (its row held
// by the caller: FOR UPDATE when the install is new): a new install supersedes the older ones; a
// superseded one is STALE_INSTALL.
std::optional<Error> register_install(pqxx::transaction_base& tx, FaultRegistry& faults, const Identity& who) {
    auto i = tx.exec_prepared("im_install", who.device, who.install);
    if (!i.empty()) {
        if (i[0][0].as<bool>() && !faults.broken("rule.stale_install")) return stale_install();
        return std::nullopt;
    }
    tx.exec_prepared("im_install_add", who.device, who.install);
    return std::nullopt;
}

} // namespace

// ---------------------------------------------------------------- hello

Outcome<Identity> Store::hello(pqxx::connection_base& c, const req::Hello& h) {
    return guarded<Identity>("hello", [&]() -> Outcome<Identity> {
        prepare_devices(c);
        pqxx::work tx(c);
        const std::string hash = token_hash_hex(h.token);
        const bool known = !tx.exec_prepared("im_hello_known", hash, h.install).empty();
        auto d = tx.exec_prepared(known ? "im_hello_device_share" : "im_hello_device", hash);
        if (d.empty()) return Error{Code::unauthenticated, "unknown or revoked device token"};
        Identity who{d[0][1].c_str(), d[0][0].c_str(), h.install, hash};
        if (auto e = register_install(tx, faults_, who)) return *e;
        tx.commit();
        return who;
    });
}

Outcome<Identity> Store::hello_jwt(pqxx::connection_base& c, const std::string& user, const std::string& device,
                                   const std::string& install, std::int64_t exp_ms) {
    return guarded<Identity>("hello", [&]() -> Outcome<Identity> {
        // The backend API's hidden per-user devices are nobody's to sign in as.
        if (std::string_view(device).starts_with(backend_device_prefix))
            return Error{Code::unauthenticated, "reserved device id"};
        prepare_devices(c);
        pqxx::work tx(c);
        if (tx.exec_prepared("im_user_exists", user).empty()) return Error{Code::unauthenticated, "unknown user"};
        // The first valid hello creates the device; its token hash is of a
        // random secret nobody holds (only `device token` hands one out).
        tx.exec_prepared("im_jwt_device_add", device, user, token_hash_hex(random_token()));
        const bool known = !tx.exec_prepared("im_jwt_known", device, install).empty();
        auto d = tx.exec_prepared(known ? "im_jwt_device_share" : "im_jwt_device", device);
        if (d.empty() || d[0][0].c_str() != user) return Error{Code::unauthenticated, "device belongs to another user"};
        if (d[0][1].as<bool>()) return device_revoked();
        Identity who{user, device, install, d[0][2].c_str(), exp_ms};
        if (auto e = register_install(tx, faults_, who)) return *e;
        tx.commit();
        return who;
    });
}

// ---------------------------------------------------------------- users, devices, tokens

bool Store::add_user(pqxx::connection_base& c, const std::string& user) {
    need_id("user", user);
    prepare_devices(c);
    pqxx::work tx(c);
    auto r = tx.exec_prepared("im_user_add", user);
    tx.commit();
    return !r.empty();
}

std::string Store::add_device(pqxx::connection_base& c, const std::string& user, const std::string& device) {
    need_id("device", device);
    prepare_devices(c);
    pqxx::work tx(c);
    if (tx.exec_prepared("im_user_exists", user).empty()) throw AdminError(AdminError::not_found, "no such user: " + user);
    if (!tx.exec_prepared("im_device_exists", device).empty())
        throw AdminError(AdminError::exists, "device exists: " + device);
    std::string token = random_token();
    tx.exec_prepared("im_device_add", device, user, token_hash_hex(token));
    tx.commit();
    return token;
}

std::string Store::reissue_token(pqxx::connection_base& c, const std::string& device) {
    prepare_devices(c);
    pqxx::work tx(c);
    std::string token = random_token();
    auto r = tx.exec_prepared("im_token_reissue", device, token_hash_hex(token));
    if (r.empty()) throw AdminError(AdminError::not_found, "no such device: " + device);
    admin_note(tx, after_commit_, "d - " + device); // the old token's connections close on every gateway
    tx.commit();
    return token;
}

void Store::revoke_device(pqxx::connection_base& c, const std::string& device) {
    prepare_devices(c);
    pqxx::work tx(c);
    auto r = tx.exec_prepared("im_device_revoke", device);
    if (r.empty()) throw AdminError(AdminError::not_found, "no such device: " + device);
    admin_note(tx, after_commit_, "d - " + device); // its connections close on every gateway
    tx.commit();
}

bool Store::user_exists(pqxx::connection_base& c, const std::string& user) {
    prepare_devices(c);
    pqxx::work tx(c);
    return !tx.exec_prepared("im_user_exists", user).empty();
}

bool Store::device_exists(pqxx::connection_base& c, const std::string& device) {
    prepare_devices(c);
    pqxx::work tx(c);
    return !tx.exec_prepared("im_device_exists", device).empty();
}

bool Store::token_valid(pqxx::connection_base& c, const std::string& device, const std::string& token) {
    prepare_devices(c);
    pqxx::work tx(c);
    return !tx.exec_prepared("im_token_valid", device, token_hash_hex(token)).empty();
}

// ---------------------------------------------------------------- backend API

std::string Store::add_api_key(pqxx::connection_base& c, const std::string& name, const std::string& scope) {
    need_id("key name", name);
    if (scope != "read" && scope != "write" && scope != "admin")
        throw AdminError(AdminError::invalid, "scope must be read, write or admin");
    const std::string key_id = random_token().substr(0, 16);
    const std::string key = "imk_" + key_id + "_" + random_token();
    prepare_devices(c);
    pqxx::work tx(c);
    auto r = tx.exec_prepared("im_api_key_add", name, key_id, token_hash_hex(key), scope);
    if (r.empty()) throw AdminError(AdminError::exists, "API key exists: " + name + " (revoke it, then add another name)");
    tx.commit();
    return key;
}

void Store::revoke_api_key(pqxx::connection_base& c, const std::string& name) {
    prepare_devices(c);
    pqxx::work tx(c);
    auto r = tx.exec_prepared("im_api_key_revoke", name);
    if (r.empty()) throw AdminError(AdminError::not_found, "no such API key: " + name);
    tx.commit();
}

std::vector<ApiKeyInfo> Store::list_api_keys(pqxx::connection_base& c) {
    prepare_devices(c);
    pqxx::nontransaction tx(c);
    std::vector<ApiKeyInfo> out;
    for (const auto& row : tx.exec_prepared("im_api_keys"))
        out.push_back({row[0].c_str(), row[1].c_str(), row[2].c_str(), row[3].c_str()});
    return out;
}

std::optional<std::pair<std::string, std::string>> Store::check_api_key(pqxx::connection_base& c,
                                                                        const std::string& key) {
    // imk_<16 hex>_<64 hex>: the row by its public id, then the hashes.
    if (key.size() != 4 + 16 + 1 + 64 || key.compare(0, 4, "imk_") != 0 || key[20] != '_') return std::nullopt;
    prepare_devices(c);
    pqxx::nontransaction tx(c);
    auto r = tx.exec_prepared("im_api_key", key.substr(4, 16));
    const std::string given = token_hash_hex(key);
    // Compared even when no row matched, so both paths cost the same.
    const std::string stored = r.empty() ? std::string(given.size(), '-') : std::string(r[0][2].c_str());
    const bool same = stored.size() == given.size() && CRYPTO_memcmp(stored.data(), given.data(), given.size()) == 0;
    if (r.empty() || !same) return std::nullopt;
    return std::make_pair(std::string(r[0][0].c_str()), std::string(r[0][1].c_str()));
}

std::optional<Identity> Store::backend_sender(pqxx::connection_base& c, const std::string& user) {
    const std::string device = std::string(backend_device_prefix) + token_hash_hex(user).substr(0, 40);
    prepare_devices(c);
    pqxx::work tx(c);
    auto r = tx.exec_prepared("im_backend_sender", device, user, token_hash_hex(random_token()));
    tx.commit();
    if (r.empty()) return std::nullopt;
    Identity who;
    who.user = user;
    who.device = device;
    who.token_sha256 = r[0][0].c_str();
    return who;
}

bool Store::conversation_exists(pqxx::connection_base& c, const std::string& conv) {
    prepare_devices(c);
    pqxx::nontransaction tx(c);
    return !tx.exec_prepared("im_conv_exists", conv).empty();
}

} // namespace im
