// A user's export (server.md, "A user's data"; GET /v1/users/{user}/export,
// imserver admin user export): everything stored for the user, read in
// batches by key (ExportCursor), each batch one short read-only
// transaction. The erase is in store_admin.cpp (it appends events).
#include "store/store_internal.hpp"

namespace im {

using namespace store_detail;

namespace {

// JSON text of SQL values, made by the database (to_json: quoting, escapes,
// numbers, null), so this part writes no JSON of its own.
const Statements& userdata_statements() {
    static const Statements table{
        {"im_export_user",
         "SELECT to_json(user_id)::text, to_json(created_at)::text, to_json(erased_at)::text FROM users WHERE user_id = $1"},
        {"im_export_devices",
         "SELECT to_json(d.device_id)::text, to_json(d.created_at)::text, to_json(d.revoked_at)::text, "
         "coalesce((SELECT json_agg(json_build_object('install', i.install_id, 'first_seen', i.first_seen, "
         "'superseded_at', i.superseded_at) ORDER BY i.first_seen) FROM device_installs i "
         "WHERE i.device_id = d.device_id), '[]'::json)::text FROM devices d WHERE d.user_id = $1 ORDER BY d.device_id"},
        {"im_export_uploads",
         "SELECT to_json(att_id::text)::text, to_json(name)::text, to_json(mime)::text, size::text, "
         "to_json(encode(sha256, 'hex'))::text, to_json(complete)::text, to_json(created_at)::text "
         "FROM uploads WHERE owner_user = $1 ORDER BY created_at, att_id"},
        {"im_export_convs", "SELECT DISTINCT conv_id FROM membership_periods WHERE user_id = $1 ORDER BY conv_id"},
        {"im_export_periods",
         "SELECT to_json(conv_id)::text, from_seq::text, coalesce(to_seq::text, 'null') FROM membership_periods "
         "WHERE user_id = $1 AND conv_id = ANY($2::text[]) ORDER BY conv_id, from_seq"},
        {"im_export_reads",
         "SELECT to_json(conv_id)::text, read::text FROM read_markers WHERE user_id = $1 AND conv_id = ANY($2::text[]) "
         "ORDER BY conv_id"},
        {"im_export_delivered",
         "SELECT to_json(m.conv_id)::text, to_json(m.device_id)::text, m.delivered::text FROM delivery_markers m "
         "JOIN devices d ON d.device_id = m.device_id WHERE d.user_id = $1 AND m.conv_id = ANY($2::text[]) "
         "ORDER BY m.conv_id, m.device_id"},
        {"im_export_mutes",
         "SELECT to_json(conv_id)::text, to_json(until)::text FROM conversation_mutes "
         "WHERE user_id = $1 AND conv_id = ANY($2::text[]) ORDER BY conv_id"},
        // Their events in one conversation above a seq (a walk of the
        // primary key: no index by sender across kinds is kept for this).
        {"im_export_events",
         "SELECT " + event_columns() + " FROM events WHERE conv_id = $1 AND seq > $3 AND sender_user = $2 "
         "ORDER BY seq LIMIT $4"},
    };
    return table;
}

constexpr std::size_t conv_chunk = 200; // conversations per batch of phase 1

} // namespace

std::vector<Store::ExportRecord> Store::export_batch(pqxx::connection_base& c, const std::string& user,
                                                      ExportCursor& cur, std::int64_t limit) {
    prepare_all(c, userdata_statements());
    std::vector<ExportRecord> out;
    pqxx::read_transaction tx(c);
    auto rec = [&](const char* type, std::vector<std::pair<std::string, std::string>> fields) {
        out.push_back(ExportRecord{type, std::move(fields), std::nullopt});
    };
    while (out.empty() && cur.phase < 3) {
        if (cur.phase == 0) {
            auto u = tx.exec_prepared("im_export_user", user);
            if (u.empty()) throw AdminError(AdminError::not_found, "no such user: " + user);
            rec("user", {{"user", u[0][0].c_str()}, {"created_at", u[0][1].c_str()}, {"erased_at", u[0][2].c_str()}});
            for (const auto& r : tx.exec_prepared("im_export_devices", user))
                rec("device", {{"device", r[0].c_str()}, {"created_at", r[1].c_str()}, {"revoked_at", r[2].c_str()},
                               {"installs", r[3].c_str()}});
            for (const auto& r : tx.exec_prepared("im_export_uploads", user))
                rec("upload", {{"att_id", r[0].c_str()}, {"name", r[1].c_str()}, {"mime", r[2].c_str()},
                               {"size", r[3].c_str()}, {"sha256", r[4].c_str()}, {"complete", r[5].c_str()},
                               {"created_at", r[6].c_str()}});
            for (const auto& r : tx.exec_prepared("im_export_convs", user)) cur.convs.push_back(r[0].c_str());
            cur.phase = 1;
        } else if (cur.phase == 1) {
            if (cur.conv_at >= cur.convs.size()) {
                cur.phase = 2;
                cur.conv_at = 0;
                continue;
            }
            const std::size_t end = std::min(cur.convs.size(), cur.conv_at + conv_chunk);
            const std::string arr = text_array(std::vector<std::string>(cur.convs.begin() + static_cast<std::ptrdiff_t>(cur.conv_at),
                                                                       cur.convs.begin() + static_cast<std::ptrdiff_t>(end)));
            for (const auto& r : tx.exec_prepared("im_export_periods", user, arr))
                rec("membership", {{"conv", r[0].c_str()}, {"from_seq", r[1].c_str()}, {"to_seq", r[2].c_str()}});
            for (const auto& r : tx.exec_prepared("im_export_reads", user, arr))
                rec("read_marker", {{"conv", r[0].c_str()}, {"read", r[1].c_str()}});
            for (const auto& r : tx.exec_prepared("im_export_delivered", user, arr))
                rec("delivery_marker", {{"conv", r[0].c_str()}, {"device", r[1].c_str()}, {"delivered", r[2].c_str()}});
            for (const auto& r : tx.exec_prepared("im_export_mutes", user, arr))
                rec("mute", {{"conv", r[0].c_str()}, {"until", r[1].c_str()}});
            cur.conv_at = end;
        } else {
            if (cur.conv_at >= cur.convs.size()) {
                cur.phase = 3;
                break;
            }
            auto rows = tx.exec_prepared("im_export_events", cur.convs[cur.conv_at], user, cur.after, limit);
            for (const auto& r : rows) {
                out.push_back(ExportRecord{"event", {}, read_event(r)});
                cur.after = out.back().event->seq;
            }
            if (static_cast<std::int64_t>(rows.size()) < limit) {
                ++cur.conv_at;
                cur.after = 0;
            }
        }
    }
    tx.commit();
    cur.counted += static_cast<std::int64_t>(out.size());
    return out;
}

} // namespace im
