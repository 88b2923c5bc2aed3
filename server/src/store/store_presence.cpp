// Typing's membership check and presence (contract section 13; the tables
// of schema/013_presence.sql; docs/scaling.md, "Presence").
//
// Presence writes keep one rule: a transaction that removes a user's row
// from presence_online first locks that user's presence_users row (in user
// order, so two writers never wait on each other in a cycle), and decides
// the user's `online` after its own change, in a statement that sees every
// change committed before it (READ COMMITTED). Two gateways closing the
// user's last two connections at once therefore cannot both see the other's
// row and leave the user online. An insert needs no lock: its settling
// UPDATE waits for a remover's lock and then re-checks the row it finds
// (online IS DISTINCT FROM what the insert's own snapshot says: true), so
// an insert racing a removal still ends online. Only rows that really
// change are settled: a reconnect onto a row that is there writes nothing.
#include "store/store_internal.hpp"

#include <algorithm>
#include <map>
#include <set>

namespace im {

using namespace store_detail;

namespace {

const Statements& presence_statements() {
    static const Statements table = {
        // typing: the caller's open period, and whether the conversation is pushed to.
        {"im_typing_gate",
         "SELECT EXISTS (SELECT 1 FROM membership_periods WHERE conv_id = $1 AND user_id = $2 AND to_seq IS NULL), "
         "(SELECT count(*) FROM membership_periods WHERE conv_id = $1 AND to_seq IS NULL) <= c.push_full_max, "
         "EXISTS (SELECT 1 FROM conversation_mutes mu WHERE mu.conv_id = $1 AND mu.user_id = $2 "
         "AND (mu.until IS NULL OR mu.until > clock_timestamp())) "
         "FROM conversations c WHERE c.conv_id = $1"},
        // presence: the asked users who share (or shared) a conversation with $1.
        {"im_presence",
         "SELECT a.user_id, coalesce(p.online, false), "
         "CASE WHEN p.online THEN floor(extract(epoch from clock_timestamp()) * 1000)::bigint "
         "ELSE p.last_seen_ms END "
         "FROM unnest($2::text[]) AS a(user_id) LEFT JOIN presence_users p ON p.user_id = a.user_id "
         "WHERE EXISTS (SELECT 1 FROM membership_periods me JOIN membership_periods them "
         "ON them.conv_id = me.conv_id WHERE me.user_id = $1 AND them.user_id = a.user_id) "
         "ORDER BY a.user_id"},
        // LAB ONLY negative control (rule.presence_strangers): every asked user who exists.
        {"im_presence_lab_strangers",
         "SELECT u.user_id, coalesce(p.online, false), "
         "CASE WHEN p.online THEN floor(extract(epoch from clock_timestamp()) * 1000)::bigint "
         "ELSE p.last_seen_ms END "
         "FROM users u LEFT JOIN presence_users p ON p.user_id = u.user_id "
         "WHERE u.user_id = ANY($2::text[]) AND $1::text IS NOT NULL ORDER BY u.user_id"},
        {"im_presence_lease",
         "INSERT INTO presence_gateways AS g (gateway_id, heartbeat_at, lease_until) "
         "VALUES ($1, now(), now() + $2 * interval '1 millisecond') ON CONFLICT (gateway_id) DO UPDATE "
         "SET heartbeat_at = EXCLUDED.heartbeat_at, lease_until = EXCLUDED.lease_until RETURNING (xmax = 0)"},
        {"im_presence_rows_of", "SELECT user_id FROM presence_online WHERE gateway_id = $1"},
        {"im_presence_lock",
         "INSERT INTO presence_users (user_id) SELECT unnest($1::text[]) ORDER BY 1 ON CONFLICT DO NOTHING"},
        {"im_presence_lock_rows",
         "SELECT user_id FROM presence_users WHERE user_id = ANY($1::text[]) ORDER BY user_id FOR UPDATE"},
        {"im_presence_add",
         "INSERT INTO presence_online (user_id, gateway_id) SELECT unnest($2::text[]), $1 ON CONFLICT DO NOTHING "
         "RETURNING user_id"},
        {"im_presence_remove", "DELETE FROM presence_online WHERE gateway_id = $1 AND user_id = ANY($2::text[])"},
        // Each user's `online` as the gateways' rows have it now (a dead
        // gateway's rows count until a sweep removes them: a gateway that
        // was only late renews its lease and its rows stay right); only
        // the changed rows are returned (and get a new version), last_seen
        // now (the database clock) for those online.
        {"im_presence_settle",
         "UPDATE presence_users p SET online = n.online, "
         "last_seen_ms = CASE WHEN n.online THEN p.last_seen_ms ELSE greatest(coalesce(p.last_seen_ms, 0), n.at) END, "
         "version = p.version + 1 "
         "FROM (SELECT a.u, a.at, EXISTS (SELECT 1 FROM presence_online o WHERE o.user_id = a.u) AS online "
         "      FROM unnest($1::text[], $2::bigint[]) AS a(u, at)) n "
         "WHERE p.user_id = n.u AND p.online IS DISTINCT FROM n.online "
         "RETURNING p.user_id, p.online, "
         "CASE WHEN p.online THEN floor(extract(epoch from clock_timestamp()) * 1000)::bigint ELSE p.last_seen_ms END, "
         "p.version"},
        {"im_presence_dead",
         "SELECT gateway_id, floor(extract(epoch from heartbeat_at) * 1000)::bigint FROM presence_gateways "
         "WHERE lease_until < now() ORDER BY gateway_id FOR UPDATE SKIP LOCKED"},
        {"im_presence_rows_of_all",
         "SELECT user_id, gateway_id FROM presence_online WHERE gateway_id = ANY($1::text[])"},
        {"im_presence_drop_gateways",
         "WITH o AS (DELETE FROM presence_online WHERE gateway_id = ANY($1::text[])) "
         "DELETE FROM presence_gateways WHERE gateway_id = ANY($1::text[])"},
    };
    return table;
}

void prepare_presence(pqxx::connection_base& c) { prepare_all(c, presence_statements()); }

std::string bigint_array(const std::vector<std::int64_t>& v) {
    std::string out = "{";
    for (std::size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
    return out + "}";
}

/// Locks the presence_users rows of `users` (made when missing), in user order.
void lock_users(pqxx::transaction_base& tx, const std::vector<std::string>& users) {
    tx.exec_prepared("im_presence_lock", text_array(users));
    tx.exec_prepared("im_presence_lock_rows", text_array(users));
}

/// Settles `at` (user -> ms time of a close, for those going offline).
std::vector<Store::PresenceChange> settle(pqxx::transaction_base& tx, const std::map<std::string, std::int64_t>& at) {
    std::vector<std::string> users;
    std::vector<std::int64_t> times;
    for (const auto& [u, t] : at) {
        users.push_back(u);
        times.push_back(t);
    }
    std::vector<Store::PresenceChange> out;
    for (const auto& row : tx.exec_prepared("im_presence_settle", text_array(users), bigint_array(times))) {
        Store::PresenceChange ch;
        ch.info.user = row[0].c_str();
        ch.info.online = row[1].as<bool>();
        if (!row[2].is_null()) ch.info.last_seen = row[2].as<std::int64_t>();
        ch.version = row[3].as<std::int64_t>();
        out.push_back(std::move(ch));
    }
    return out;
}

} // namespace

std::string Store::PresenceChange::payload() const {
    return "p " + info.user + (info.online ? " 1 " : " 0 ") +
           (info.last_seen ? std::to_string(*info.last_seen) : std::string("-")) + " " + std::to_string(version);
}

Outcome<bool> Store::typing_gate(pqxx::connection_base& c, const Identity& who, const std::string& conv) {
    return guarded<bool>("typing", [&]() -> Outcome<bool> {
        prepare_presence(c);
        pqxx::nontransaction tx(c);
        auto r = tx.exec_prepared("im_typing_gate", conv, who.user);
        if (r.empty() || !r[0][0].as<bool>()) return not_member();
        if (r[0][2].as<bool>()) return muted(); // server.md, moderation
        return r[0][1].as<bool>();
    });
}

Outcome<PresenceList> Store::presence(pqxx::connection_base& c, const Identity& who,
                                      const std::vector<std::string>& users) {
    return guarded<PresenceList>("presence", [&]() -> Outcome<PresenceList> {
        prepare_presence(c);
        pqxx::nontransaction tx(c);
        PresenceList out;
        const char* stmt = faults_.broken("rule.presence_strangers") ? "im_presence_lab_strangers" : "im_presence";
        for (const auto& row : tx.exec_prepared(stmt, who.user, text_array(users))) {
            PresenceInfo p;
            p.user = row[0].c_str();
            p.online = row[1].as<bool>();
            if (!row[2].is_null()) p.last_seen = row[2].as<std::int64_t>();
            out.users.push_back(std::move(p));
        }
        return out;
    });
}

std::vector<Store::PresenceChange> Store::presence_write(pqxx::connection_base& c, const std::string& gateway,
                                                         std::int64_t lease_ms, const std::vector<std::string>& online,
                                                         const std::vector<std::pair<std::string, std::int64_t>>& offline,
                                                         bool full, std::int64_t now_ms) {
    prepare_presence(c);
    pqxx::work tx(c);
    tx.exec_prepared("im_presence_lease", gateway, lease_ms);
    std::map<std::string, std::int64_t> at; // users whose rows change; the close time for those going offline
    std::set<std::string> add(online.begin(), online.end());
    for (const auto& [u, t] : offline)
        if (!add.count(u)) at[u] = t;
    if (full) {
        // Only the difference to the rows there: those no longer online
        // here go (offline at now_ms), those already there stay untouched.
        for (const auto& row : tx.exec_prepared("im_presence_rows_of", gateway)) {
            const std::string u = row[0].c_str();
            if (!add.erase(u)) at.emplace(u, now_ms);
        }
    }
    if (!at.empty()) {
        std::vector<std::string> off;
        for (const auto& [u, t] : at) off.push_back(u); // sorted: the map's order
        lock_users(tx, off);
        tx.exec_prepared("im_presence_remove", gateway, text_array(off));
    }
    if (!add.empty()) {
        const std::vector<std::string> on(add.begin(), add.end()); // sorted
        tx.exec_prepared("im_presence_lock", text_array(on)); // the presence_users rows, made when missing
        for (const auto& row : tx.exec_prepared("im_presence_add", gateway, text_array(on))) at.emplace(row[0].c_str(), 0);
    }
    if (at.empty()) {
        tx.commit();
        return {};
    }
    auto changes = settle(tx, at);
    tx.commit();
    return changes;
}

bool Store::presence_heartbeat(pqxx::connection_base& c, const std::string& gateway, std::int64_t lease_ms) {
    prepare_presence(c);
    pqxx::nontransaction tx(c);
    auto r = tx.exec_prepared("im_presence_lease", gateway, lease_ms);
    return !r[0][0].as<bool>(); // not inserted: the row was there
}

std::vector<Store::PresenceChange> Store::presence_sweep(pqxx::connection_base& c) {
    prepare_presence(c);
    pqxx::work tx(c);
    std::vector<std::string> dead;
    std::map<std::string, std::int64_t> heartbeat;
    for (const auto& row : tx.exec_prepared("im_presence_dead")) {
        dead.emplace_back(row[0].c_str());
        heartbeat[dead.back()] = row[1].as<std::int64_t>();
    }
    if (dead.empty()) return {};
    std::map<std::string, std::int64_t> at; // a user of several dead gateways: the latest heartbeat
    for (const auto& row : tx.exec_prepared("im_presence_rows_of_all", text_array(dead))) {
        auto& t = at[row[0].c_str()];
        t = std::max(t, heartbeat[row[1].c_str()]);
    }
    std::vector<std::string> users;
    for (const auto& [u, t] : at) users.push_back(u);
    if (!users.empty()) lock_users(tx, users);
    tx.exec_prepared("im_presence_drop_gateways", text_array(dead));
    auto changes = at.empty() ? std::vector<PresenceChange>{} : settle(tx, at);
    tx.commit();
    for (const auto& g : dead)
        log_warn("presence_gateway_expired", {{"gateway", g}, {"users", static_cast<long>(at.size())}});
    return changes;
}

std::vector<Store::PresenceChange> Store::presence_release(pqxx::connection_base& c, const std::string& gateway,
                                                           std::int64_t at_ms) {
    auto changes = presence_write(c, gateway, 0, {}, {}, true, at_ms);
    prepare_presence(c);
    pqxx::nontransaction tx(c);
    tx.exec_prepared("im_presence_drop_gateways", text_array({gateway}));
    return changes;
}

} // namespace im
