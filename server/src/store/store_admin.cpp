// The store's writes other than send: recall (contract section 6) and the
// operator commands on conversations (create, members, settings, epoch,
// retention purge). Both append events through the same statement. The
// admin CLI and the backend API reach the operator commands through the
// same functions (provisioning.hpp).
#include "store/store_internal.hpp"

#include <algorithm>
#include <set>
#include <stdexcept>

namespace im {

using namespace store_detail;

namespace {

// Appends an event at the conversation's next seq, in one statement: take
// the seq (bump next_seq), insert the row with its running counts for
// `unread`, and (for the admin CLI, which has no bus of its own) queue the
// notification. Gateways publish after COMMIT instead (bus.hpp). The caller
// holds the conversation row lock, so commit order equals seq order.
// $1 conv, $2 channel, $3 kind, $4 the fingerprint's argument, $5 sender,
// $6 cmid, $7 has a body, $8 body, $9 target, $10 subject, $11 notify.
std::string append_sql(const std::string& fingerprint_sql) {
    const std::string fp =
        fingerprint_sql.empty() ? std::string("(CASE WHEN $4::text IS NULL THEN NULL END)::bytea") : fingerprint_sql;
    return "WITH c AS (UPDATE conversations SET next_seq = next_seq + 1, "
           "           msg_count = msg_count + CASE WHEN $3 = 'msg' THEN 1 ELSE 0 END "
           "           WHERE conv_id = $1 RETURNING next_seq - 1 AS seq, msg_count, epoch), "
           "e AS (INSERT INTO events (conv_id, seq, kind, sender_user, client_msg_id, request_hash, body, target_seq, "
           "      subject_user, epoch, msg_ordinal, sender_ordinal) "
           "      SELECT $1, c.seq, $3, NULLIF($5, ''), NULLIF($6, ''), " + fp +
           ",      CASE WHEN $7 THEN $8 END, NULLIF($9, '')::bigint, NULLIF($10, ''), c.epoch, c.msg_count, "
           "      CASE WHEN $3 = 'msg' THEN COALESCE((SELECT p.sender_ordinal FROM events p WHERE p.conv_id = $1 "
           "           AND p.sender_user = $5 AND p.kind = 'msg' ORDER BY p.seq DESC LIMIT 1), 0) + 1 END "
           "      FROM c RETURNING seq, mid::text AS mid, " + ts_ms + " AS ts, epoch) "
           "SELECT seq, mid, ts, epoch, CASE WHEN $11 THEN pg_notify($2, 'e ' || $1 || ' ' || seq) END FROM e";
}

// Every statement of this part, prepared per connection (prepare_all).
const Statements& admin_statements() {
    static const Statements table{
        {"im_append_recall", append_sql(recall_fp)},
        {"im_append_admin", append_sql("")},
        // The conversation row, held until COMMIT (appends are in seq order).
        {"im_conv_lock", std::string("SELECT ") + conv_columns + " FROM conversations WHERE conv_id = $1 FOR UPDATE"},
        // A user's membership periods in one conversation.
        {"im_periods",
         "SELECT from_seq, to_seq FROM membership_periods WHERE conv_id = $1 AND user_id = $2 ORDER BY from_seq"},
        {"im_open_period",
         "SELECT from_seq FROM membership_periods WHERE conv_id = $1 AND user_id = $2 AND to_seq IS NULL"},
        // recall: a member at all (no lock taken first, C4).
        {"im_any_period", "SELECT 1 FROM membership_periods WHERE conv_id = $1 AND user_id = $2 LIMIT 1"},
        // The caller's device row, held (FOR SHARE, behind the device's gate:
        // schema/functions/im_device_gate.sql) until the transaction ends, as
        // im_send does for sends: a revocation or a new token waits for this
        // transaction, and one that committed first leaves no row.
        {"im_hold_device",
         "SELECT coalesce(d.current_install, '') FROM devices d WHERE " + device_valid_where(1, 2, 3) +
             " AND im_device_gate_shared($1::text) FOR SHARE"},
        // The request key, as for send, with the recall fingerprint (looked
        // up through the key's index: OFFSET 0 keeps ORDER BY seq from
        // choosing a walk of the conversation by primary key, as in im_send).
        // A key held by a send never matches (C3: another kind of request
        // is other content, even where the fingerprints' bytes agree). The
        // send side of this rule is the key lookup in
        // schema/functions/im_send.sql.
        {"im_recall_key",
         std::string("SELECT seq, coalesce(kind = 'recall' AND request_hash = ") + recall_fp +
             ", false) FROM (SELECT seq, kind, request_hash FROM events WHERE conv_id = $1 AND sender_user = $2 "
             "AND client_msg_id = $3 OFFSET 0) found ORDER BY seq LIMIT 1"},
        {"im_tombstone", "SELECT 1 FROM idem_tombstones WHERE conv_id = $1 AND sender_user = $2 AND client_msg_id = $3"},
        {"im_recall_target",
         "SELECT kind, sender_user, clock_timestamp() <= created_at + $3 * interval '1 millisecond' "
         "FROM events WHERE conv_id = $1 AND seq = $2"},
        {"im_recalled", "SELECT 1 FROM events WHERE conv_id = $1 AND kind = 'recall' AND target_seq = $2"},
        // Operator commands.
        {"im_conv_add",
         "INSERT INTO conversations (conv_id, kind) VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING 1"},
        {"im_conv_current",
         "SELECT c.kind, m.user_id FROM conversations c LEFT JOIN membership_periods m "
         "ON m.conv_id = c.conv_id AND m.to_seq IS NULL WHERE c.conv_id = $1 ORDER BY m.user_id"},
        {"im_admin_user", "SELECT 1 FROM users WHERE user_id = $1"},
        {"im_admin_users_missing",
         "SELECT u FROM unnest($1::text[]) u WHERE NOT EXISTS (SELECT 1 FROM users WHERE user_id = u)"},
        {"im_member_open", "INSERT INTO membership_periods (conv_id, user_id, from_seq) VALUES ($1, $2, $3)"},
        {"im_member_close",
         "UPDATE membership_periods SET to_seq = $3 WHERE conv_id = $1 AND user_id = $2 AND to_seq IS NULL"},
        {"im_set_recall_window", "UPDATE conversations SET recall_window_ms = $2 WHERE conv_id = $1"},
        {"im_set_push_full_max", "UPDATE conversations SET push_full_max = $2 WHERE conv_id = $1"},
        {"im_set_edit_window", "UPDATE conversations SET edit_window_ms = $2 WHERE conv_id = $1"},
        {"im_bump_epoch", "UPDATE conversations SET epoch = epoch + 1 WHERE conv_id = $1 RETURNING epoch"},
        {"im_purge_cutoff_age",
         "SELECT COALESCE(min(seq), $2) FROM events WHERE conv_id = $1 "
         "AND created_at > clock_timestamp() - $3 * interval '1 millisecond'"},
        {"im_purge_tombstones",
         "INSERT INTO idem_tombstones (conv_id, sender_user, client_msg_id, request_hash, seq) "
         "SELECT conv_id, sender_user, client_msg_id, request_hash, seq FROM events "
         "WHERE conv_id = $1 AND seq < $2 AND client_msg_id IS NOT NULL ON CONFLICT DO NOTHING"},
        {"im_purge_events", "DELETE FROM events WHERE conv_id = $1 AND seq < $2"},
        // What reads showed of the purged msgs' later changes (schema/012).
        {"im_purge_changes",
         "WITH a AS (DELETE FROM msg_changes WHERE conv_id = $1 AND seq < $2), "
         "b AS (DELETE FROM reaction_counts WHERE conv_id = $1 AND target_seq < $2) "
         "DELETE FROM reaction_state WHERE conv_id = $1 AND target_seq < $2"},
        {"im_purge_min_seq", "UPDATE conversations SET min_seq = $2 WHERE conv_id = $1"},
        {"im_all_convs", "SELECT conv_id FROM conversations ORDER BY conv_id"},
        // Moderation (schema/015; server.md, "Rate limits and moderation").
        // $3: an ISO time, $4: ms from now; both empty: until removed.
        {"im_mute_set",
         "INSERT INTO conversation_mutes (conv_id, user_id, until) VALUES ($1, $2, "
         "COALESCE(NULLIF($3::text, '')::timestamptz, "
         "CASE WHEN $4::bigint >= 0 THEN clock_timestamp() + $4::bigint * interval '1 millisecond' END)) "
         "ON CONFLICT (conv_id, user_id) DO UPDATE SET until = excluded.until, created_at = now() "
         "RETURNING CASE WHEN until IS NULL THEN '' ELSE "
         "to_char(until AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"') END"},
        {"im_mute_clear", "DELETE FROM conversation_mutes WHERE conv_id = $1 AND user_id = $2 RETURNING 1"},
        // The operator's recall of one msg: the target, and its recall if any.
        {"im_redact_target",
         "SELECT e.kind, (SELECT r.seq FROM events r WHERE r.conv_id = e.conv_id AND r.kind = 'recall' "
         "AND r.target_seq = e.seq ORDER BY r.seq LIMIT 1) FROM events e WHERE e.conv_id = $1 AND e.seq = $2"},
        // The next batch of a user's msgs not recalled yet (resumable: a
        // rerun finds what an interrupted run left).
        {"im_redact_batch",
         "SELECT e.seq FROM events e WHERE e.conv_id = $1 AND e.sender_user = $2 AND e.kind = 'msg' "
         "AND NOT EXISTS (SELECT 1 FROM events r WHERE r.conv_id = e.conv_id AND r.kind = 'recall' "
         "AND r.target_seq = e.seq) ORDER BY e.seq LIMIT $3"},
        // A user's erase (schema/017; server.md, "A user's data").
        {"im_erase_user",
         "UPDATE users SET erased_at = coalesce(erased_at, now()) WHERE user_id = $1 RETURNING 1"},
        {"im_erase_devices",
         "UPDATE devices SET revoked_at = now() WHERE user_id = $1 AND revoked_at IS NULL RETURNING device_id"},
        {"im_erase_convs", "SELECT DISTINCT conv_id FROM membership_periods WHERE user_id = $1 ORDER BY conv_id"},
        // Their reactions stop counting (the events themselves are erased below).
        {"im_erase_reactions",
         "WITH s AS (DELETE FROM reaction_state WHERE conv_id = $1 AND user_id = $2 RETURNING target_seq, emoji, is_on) "
         "UPDATE reaction_counts n SET count = n.count - 1 FROM s "
         "WHERE s.is_on AND n.conv_id = $1 AND n.target_seq = s.target_seq AND n.emoji = s.emoji AND n.count > 0 "
         "RETURNING n.target_seq"},
        // The summary a page shows (schema/018) of the messages whose counts
        // just changed, ranked again as im_change ranks it (a statement of
        // its own: the one above cannot see its own updates).
        {"im_erase_reaction_summaries",
         "UPDATE msg_changes x SET reactions_top = (SELECT json_agg(json_build_array(t.emoji, t.count) "
         "ORDER BY t.count DESC, t.emoji COLLATE \"C\")::text FROM (SELECT n.emoji, n.count FROM reaction_counts n "
         "WHERE n.conv_id = x.conv_id AND n.target_seq = x.seq AND n.count > 0 "
         "ORDER BY n.count DESC, n.emoji COLLATE \"C\" LIMIT 20) t) "
         "WHERE x.conv_id = $1 AND x.seq = ANY($2::bigint[])"},
        {"im_erase_mute", "DELETE FROM conversation_mutes WHERE conv_id = $1 AND user_id = $2"},
        // The next batch of the user's events with content, above $3 (a
        // walk of the conversation's primary key inside the user's periods:
        // they can only have written while a member). A rerun starts at 0
        // and finds what an interrupted run left.
        {"im_erase_batch",
         "SELECT e.seq, e.kind, e.kind = 'msg' AND NOT EXISTS (SELECT 1 FROM events r WHERE r.conv_id = e.conv_id "
         "AND r.kind = 'recall' AND r.target_seq = e.seq) FROM events e WHERE e.conv_id = $1 AND e.seq > $3 "
         "AND e.seq <= $5 AND e.sender_user = $2 AND NOT e.erased ORDER BY e.seq LIMIT $4"},
        {"im_erase_tombstones",
         "INSERT INTO idem_tombstones (conv_id, sender_user, client_msg_id, request_hash, seq) "
         "SELECT conv_id, sender_user, client_msg_id, request_hash, seq FROM events "
         "WHERE conv_id = $1 AND seq = ANY($2::bigint[]) AND client_msg_id IS NOT NULL ON CONFLICT DO NOTHING"},
        // A page shows no more of an erased winning edit.
        {"im_erase_edits",
         "UPDATE msg_changes SET edit_seq = NULL, edit_body = NULL, edit_at = NULL "
         "WHERE conv_id = $1 AND (edit_seq = ANY($2::bigint[]) OR seq = ANY($2::bigint[]))"},
        {"im_erase_attachments", "DELETE FROM event_attachments WHERE conv_id = $1 AND seq = ANY($2::bigint[])"},
        {"im_erase_events",
         "UPDATE events SET body = NULL, attachments = NULL, emoji = NULL, react_on = NULL, client_msg_id = NULL, "
         "request_hash = NULL, erased = true WHERE conv_id = $1 AND seq = ANY($2::bigint[])"},
        // Their uploads no msg references any more (complete or not): the
        // bytes of a 'pg' upload go with the row (upload_chunks cascades).
        {"im_erase_uploads",
         "DELETE FROM uploads u WHERE u.owner_user = $1 AND u.store = 'pg' AND NOT EXISTS "
         "(SELECT 1 FROM event_attachments a WHERE a.att_id = u.att_id) RETURNING 1"},
    };
    return table;
}

void prepare_admin(pqxx::connection_base& c) { prepare_all(c, admin_statements()); }

struct Appended { std::int64_t seq; std::string mid; std::int64_t ts; std::int64_t epoch; };

// `statement`: im_append_recall (fingerprint of $4) or im_append_admin.
Appended append_event(pqxx::transaction_base& tx, const char* statement, const std::string& conv,
                      const std::string& kind, const std::optional<std::string>& sender,
                      const std::optional<std::string>& cmid, const std::optional<std::string>& body,
                      std::optional<std::int64_t> target, const std::optional<std::string>& subject,
                      const std::string& fp_arg, bool notify_in_tx) {
    auto r = tx.exec_prepared(statement, conv, std::string(notify_channel), kind, fp_arg, sender.value_or(""),
                              cmid.value_or(""), body.has_value(), body.value_or(""),
                              target ? std::to_string(*target) : "", subject.value_or(""), notify_in_tx);
    if (r.empty()) throw std::runtime_error("append: conversation row vanished: " + conv);
    return {r[0][0].as<std::int64_t>(), r[0][1].c_str(), r[0][2].as<std::int64_t>(), r[0][3].as<std::int64_t>()};
}

std::optional<ConvRow> lock_conv(pqxx::transaction_base& tx, const std::string& conv) {
    auto r = tx.exec_prepared("im_conv_lock", conv);
    if (r.empty()) return std::nullopt;
    return conv_row(r[0]);
}

Access load_access(pqxx::transaction_base& tx, const std::string& conv, const std::string& user,
                   std::int64_t next_seq) {
    Access a;
    std::int64_t last_to = 0;
    for (const auto& row : tx.exec_prepared("im_periods", conv, user)) {
        Access::Period p{row[0].as<std::int64_t>(), INT64_MAX};
        if (row[1].is_null()) a.open = true;
        else {
            p.to = row[1].as<std::int64_t>();
            last_to = std::max(last_to, p.to);
        }
        a.periods.push_back(p);
    }
    // A former member learns nothing of traffic after their last period.
    a.head = a.open ? next_seq - 1 : last_to;
    return a;
}

ConvRow need_conv(pqxx::transaction_base& tx, const std::string& conv) {
    auto row = lock_conv(tx, conv);
    if (!row) throw AdminError(AdminError::not_found, "no such conversation: " + conv);
    return *row;
}

std::int64_t admin_append(pqxx::transaction_base& tx, Notes* sink, const std::string& conv, const std::string& kind,
                          const std::string& subject) {
    auto a = append_event(tx, "im_append_admin", conv, kind, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                          subject, "", sink == nullptr);
    if (sink) sink->push_back("e " + conv + " " + std::to_string(a.seq));
    return a.seq;
}

std::int64_t open_member(pqxx::transaction_base& tx, Notes* sink, const std::string& conv, const std::string& user) {
    auto seq = admin_append(tx, sink, conv, "join", user);
    tx.exec_prepared("im_member_open", conv, user, seq);
    return seq;
}

} // namespace

// ---------------------------------------------------------------- recall

Outcome<Recalled> Store::recall(pqxx::connection_base& c, const Identity& who, const req::Recall& rc) {
    return guarded<Recalled>("recall", [&]() -> Outcome<Recalled> {
        prepare_admin(c);
        pqxx::work tx(c);
        // Without any lock first (C4): a stranger never waits on the row lock.
        if (tx.exec_prepared("im_any_period", rc.conv, who.user).empty()) return not_member();
        if (tx.exec_prepared("im_hold_device", who.device, who.user, who.token_sha256).empty()) return device_revoked();
        auto conv = lock_conv(tx, rc.conv);
        if (!conv) return not_member();
        auto access = load_access(tx, rc.conv, who.user, conv->next_seq);
        if (!access.any()) return not_member(); // C4: nothing else is revealed
        const std::string target = std::to_string(rc.target);
        auto k = tx.exec_prepared("im_recall_key", rc.conv, who.user, rc.cmid, target);
        if (!k.empty()) {
            if (!k[0][1].as<bool>())
                return Error{Code::idempotency_mismatch, "cmid already used with different content"};
            return Recalled{rc.conv, k[0][0].as<std::int64_t>(), true};
        }
        if (!tx.exec_prepared("im_tombstone", rc.conv, who.user, rc.cmid).empty())
            return Error{Code::original_expired, "the original was purged by retention"};
        // The target: exists and not purged; readable; a msg; ours; not recalled; in the window.
        if (rc.target < 1 || rc.target > access.head || rc.target < conv->min_seq)
            return Error{Code::not_found, "no such event"};
        auto ev = tx.exec_prepared("im_recall_target", rc.conv, rc.target, conv->recall_window_ms);
        if (ev.empty()) return Error{Code::not_found, "no such event"};
        if (!access.can_read(rc.target)) return not_member();
        if (std::string_view(ev[0][0].c_str()) != "msg") return invalid("only a msg event can be recalled");
        if (ev[0][1].is_null() || who.user != ev[0][1].c_str())
            return Error{Code::not_sender, "only the sender may recall"};
        if (!tx.exec_prepared("im_recalled", rc.conv, rc.target).empty())
            return Error{Code::already_recalled, "already recalled"};
        if (!ev[0][2].as<bool>() && !faults_.broken("rule.recall_window"))
            return Error{Code::recall_window_expired, "past the recall window"};
        if (!access.open) return not_member();
        auto a = append_event(tx, "im_append_recall", rc.conv, "recall", who.user, rc.cmid, std::nullopt, rc.target,
                              std::nullopt, target, false);
        if (faults_.hit("store.recall_before_commit") == FaultKind::unavailable) return unavailable("injected fault");
        tx.commit();
        return Recalled{rc.conv, a.seq, false};
    });
}

// ---------------------------------------------------------------- operator commands

bool Store::create_conv(pqxx::connection_base& c, const std::string& conv, const std::string& kind,
                        const std::vector<std::string>& members) {
    need_id("conversation", conv);
    if (kind != "direct" && kind != "group") throw AdminError(AdminError::invalid, "kind must be direct or group");
    if (kind == "direct" && members.size() != 2) throw AdminError(AdminError::invalid, "a direct conversation has 2 members");
    prepare_admin(c);
    pqxx::work tx(c);
    auto r = tx.exec_prepared("im_conv_add", conv, kind);
    if (r.empty()) {
        // The same conversation again (kind and current members) is fine.
        auto existing = tx.exec_prepared("im_conv_current", conv);
        std::vector<std::string> wanted = members, current;
        std::sort(wanted.begin(), wanted.end());
        for (const auto& row : existing)
            if (!row[1].is_null()) current.push_back(row[1].c_str());
        if (!existing.empty() && existing[0][0].as<std::string>() == kind && current == wanted) return false;
        throw AdminError(AdminError::exists, "conversation exists with other settings: " + conv);
    }
    // The members checked in one round trip, then two statements each (the
    // join event and the period): a 5,000-member create is some 10,000
    // short round trips, each bounded by --db-timeout-ms, not the whole.
    std::set<std::string> missing, seen;
    for (const auto& row : tx.exec_prepared("im_admin_users_missing", text_array(members)))
        missing.insert(row[0].c_str());
    for (const auto& u : members) {
        if (missing.count(u)) throw AdminError(AdminError::not_found, "no such user: " + u);
        if (!seen.insert(u).second) throw AdminError(AdminError::invalid, "member listed twice: " + u);
    }
    need_conv(tx, conv); // held until COMMIT: the joins take their seqs in order
    for (const auto& u : members) open_member(tx, after_commit_, conv, u);
    tx.commit();
    return true;
}

std::int64_t Store::add_member(pqxx::connection_base& c, const std::string& conv, const std::string& user,
                               bool* already) {
    if (already) *already = false;
    prepare_admin(c);
    pqxx::work tx(c);
    need_conv(tx, conv);
    if (tx.exec_prepared("im_admin_user", user).empty()) throw AdminError(AdminError::not_found, "no such user: " + user);
    auto open = tx.exec_prepared("im_open_period", conv, user);
    if (!open.empty()) {
        if (already) {
            *already = true;
            return open[0][0].as<std::int64_t>(); // the seq of the join that opened the period
        }
        throw AdminError(AdminError::exists, user + " is already a member of " + conv);
    }
    auto seq = open_member(tx, after_commit_, conv, user);
    tx.commit();
    return seq;
}

std::int64_t Store::remove_member(pqxx::connection_base& c, const std::string& conv, const std::string& user) {
    prepare_admin(c);
    pqxx::work tx(c);
    need_conv(tx, conv);
    if (tx.exec_prepared("im_open_period", conv, user).empty())
        throw AdminError(AdminError::not_member, user + " is not a member of " + conv);
    auto seq = admin_append(tx, after_commit_, conv, "leave", user);
    tx.exec_prepared("im_member_close", conv, user, seq);
    tx.commit();
    return seq;
}

void Store::set_conv(pqxx::connection_base& c, const std::string& conv, std::optional<std::int64_t> recall_window_ms,
                     std::optional<std::int64_t> push_full_max, std::optional<std::int64_t> edit_window_ms) {
    prepare_admin(c);
    pqxx::work tx(c);
    need_conv(tx, conv);
    if (recall_window_ms) tx.exec_prepared("im_set_recall_window", conv, *recall_window_ms);
    if (push_full_max) tx.exec_prepared("im_set_push_full_max", conv, *push_full_max);
    if (edit_window_ms) tx.exec_prepared("im_set_edit_window", conv, *edit_window_ms);
    admin_note(tx, after_commit_, "m " + conv); // gateways drop their cached membership of it
    tx.commit();
}

std::int64_t Store::bump_epoch(pqxx::connection_base& c, const std::string& conv) {
    prepare_admin(c);
    pqxx::work tx(c);
    need_conv(tx, conv);
    auto r = tx.exec_prepared("im_bump_epoch", conv);
    admin_note(tx, after_commit_, "x " + conv);
    tx.commit();
    return r[0][0].as<std::int64_t>();
}

std::int64_t Store::purge(pqxx::connection_base& c, const std::string& conv, std::optional<std::int64_t> before_seq,
                          std::optional<std::int64_t> older_than_ms, std::int64_t batch) {
    prepare_admin(c);
    std::int64_t cutoff = 0;
    {
        pqxx::work tx(c);
        auto row = need_conv(tx, conv);
        if (before_seq) cutoff = std::min(*before_seq, row.next_seq);
        else cutoff = tx.exec_prepared("im_purge_cutoff_age", conv, row.next_seq, *older_than_ms)[0][0].as<std::int64_t>();
        tx.commit();
    }
    std::int64_t purged = 0;
    for (;;) {
        // One batch, one transaction: tombstones, delete, raise min_seq together.
        pqxx::work tx(c);
        auto row = need_conv(tx, conv);
        if (row.min_seq >= cutoff) break;
        std::int64_t end = std::min(cutoff, row.min_seq + batch);
        if (!lab_.purge_without_tombstones) tx.exec_prepared("im_purge_tombstones", conv, end);
        if (faults_.hit("store.purge_after_tombstones") == FaultKind::unavailable)
            throw std::runtime_error("purge: injected fault after the tombstones");
        auto d = tx.exec_prepared("im_purge_events", conv, end);
        tx.exec_prepared("im_purge_changes", conv, end);
        tx.exec_prepared("im_purge_min_seq", conv, end);
        if (faults_.hit("store.purge_before_commit") == FaultKind::unavailable)
            throw std::runtime_error("purge: injected fault before the commit");
        tx.commit();
        purged += static_cast<std::int64_t>(d.affected_rows());
    }
    return purged;
}

std::vector<std::string> Store::all_convs(pqxx::connection_base& c) {
    prepare_admin(c);
    pqxx::work tx(c);
    std::vector<std::string> out;
    for (const auto& row : tx.exec_prepared("im_all_convs")) out.push_back(row[0].c_str());
    return out;
}

// ---------------------------------------------------------------- moderation

std::string Store::set_mute(pqxx::connection_base& c, const std::string& conv, const std::string& user,
                            const std::string& until_iso, std::optional<std::int64_t> for_ms) {
    prepare_admin(c);
    pqxx::work tx(c);
    need_conv(tx, conv);
    if (tx.exec_prepared("im_admin_user", user).empty()) throw AdminError(AdminError::not_found, "no such user: " + user);
    pqxx::result r;
    try {
        pqxx::subtransaction sub(tx);
        r = sub.exec_prepared("im_mute_set", conv, user, until_iso, for_ms.value_or(-1));
        sub.commit();
    } catch (const pqxx::data_exception&) {
        throw AdminError(AdminError::invalid, "'until' must be an ISO 8601 time, e.g. 2026-12-31T23:59:00Z");
    }
    tx.commit();
    return r[0][0].c_str();
}

bool Store::clear_mute(pqxx::connection_base& c, const std::string& conv, const std::string& user) {
    prepare_admin(c);
    pqxx::work tx(c);
    need_conv(tx, conv);
    const bool had = !tx.exec_prepared("im_mute_clear", conv, user).empty();
    tx.commit();
    return had;
}

Store::Redacted Store::redact(pqxx::connection_base& c, const std::string& conv, std::int64_t seq) {
    prepare_admin(c);
    pqxx::work tx(c);
    need_conv(tx, conv); // the row lock: the recall's seq in commit order
    auto t = tx.exec_prepared("im_redact_target", conv, seq);
    if (t.empty()) throw AdminError(AdminError::not_found, "no such event: " + conv + " " + std::to_string(seq));
    if (std::string_view(t[0][0].c_str()) != "msg") throw AdminError(AdminError::invalid, "only a msg event can be redacted");
    if (!t[0][1].is_null()) return {t[0][1].as<std::int64_t>(), true};
    auto a = append_event(tx, "im_append_admin", conv, "recall", std::nullopt, std::nullopt, std::nullopt, seq,
                          std::nullopt, "", after_commit_ == nullptr);
    if (after_commit_) after_commit_->push_back("e " + conv + " " + std::to_string(a.seq));
    tx.commit();
    return {a.seq, false};
}

std::int64_t Store::redact_user(pqxx::connection_base& c, const std::string& conv, const std::string& user,
                                std::int64_t batch) {
    std::int64_t total = 0;
    {
        prepare_admin(c);
        pqxx::work tx(c);
        need_conv(tx, conv);
        if (tx.exec_prepared("im_admin_user", user).empty())
            throw AdminError(AdminError::not_found, "no such user: " + user);
    }
    // One transaction per batch: the conversation's sends wait for one
    // batch at a time, and what committed stays done if the run stops.
    for (;;) {
        pqxx::work tx(c);
        need_conv(tx, conv);
        auto rows = tx.exec_prepared("im_redact_batch", conv, user, batch);
        if (rows.empty()) break;
        std::int64_t lo = 0, hi = 0;
        for (const auto& row : rows) {
            auto a = append_event(tx, "im_append_admin", conv, "recall", std::nullopt, std::nullopt, std::nullopt,
                                  row[0].as<std::int64_t>(), std::nullopt, "", false);
            if (!lo) lo = a.seq;
            hi = a.seq;
        }
        // One notification per batch ('e CONV HIGH LOW', as a send group's).
        admin_note(tx, after_commit_, "e " + conv + " " + std::to_string(hi) + (lo < hi ? " " + std::to_string(lo) : ""));
        tx.commit();
        total += static_cast<std::int64_t>(rows.size());
        if (static_cast<std::int64_t>(rows.size()) < batch) break;
    }
    return total;
}

// ---------------------------------------------------------------- a user's erase

Store::Erased Store::erase_user(pqxx::connection_base& c, const std::string& user, std::int64_t batch) {
    prepare_admin(c);
    Erased out;
    std::vector<std::string> convs;
    {
        // First the user's access: no device of theirs writes while the
        // rest runs (the backend API's sends on their behalf meet the
        // closed memberships below).
        pqxx::work tx(c);
        if (tx.exec_prepared("im_erase_user", user).empty())
            throw AdminError(AdminError::not_found, "no such user: " + user);
        for (const auto& row : tx.exec_prepared("im_erase_devices", user)) {
            admin_note(tx, after_commit_, std::string("d - ") + row[0].c_str()); // connections close everywhere
            ++out.devices;
        }
        for (const auto& row : tx.exec_prepared("im_erase_convs", user)) convs.push_back(row[0].c_str());
        tx.commit();
    }
    for (const auto& conv : convs) {
        std::int64_t last = 0; // the highest seq the user may have written here
        {
            pqxx::work tx(c);
            auto row = need_conv(tx, conv);
            if (!tx.exec_prepared("im_open_period", conv, user).empty()) {
                auto seq = admin_append(tx, after_commit_, conv, "leave", user);
                tx.exec_prepared("im_member_close", conv, user, seq);
                ++out.memberships;
                last = seq;
            } else {
                last = row.next_seq - 1;
            }
            std::vector<std::string> targets;
            for (const auto& r : tx.exec_prepared("im_erase_reactions", conv, user)) targets.emplace_back(r[0].c_str());
            if (!targets.empty()) tx.exec_prepared("im_erase_reaction_summaries", conv, text_array(targets));
            tx.exec_prepared("im_erase_mute", conv, user);
            tx.commit();
        }
        // One transaction per batch, as redact_user: the conversation's
        // sends wait for one batch at a time; what committed stays done.
        std::int64_t after = 0;
        for (;;) {
            pqxx::work tx(c);
            need_conv(tx, conv);
            auto rows = tx.exec_prepared("im_erase_batch", conv, user, after, batch, last);
            if (rows.empty()) break;
            std::vector<std::string> seqs, recalls;
            std::int64_t lo = 0, hi = 0;
            for (const auto& r : rows) {
                const auto seq = r[0].as<std::int64_t>();
                seqs.push_back(std::to_string(seq));
                after = seq;
                // A msg not recalled yet: the operator's recall tells every
                // client that stored it (the SDKs drop a recalled body).
                if (r[2].as<bool>()) {
                    auto a = append_event(tx, "im_append_admin", conv, "recall", std::nullopt, std::nullopt,
                                          std::nullopt, seq, std::nullopt, "", false);
                    if (!lo) lo = a.seq;
                    hi = a.seq;
                    recalls.push_back(std::to_string(a.seq));
                    ++out.recalls;
                }
            }
            const std::string arr = text_array(seqs);
            if (!lab_.erase_without_tombstones) tx.exec_prepared("im_erase_tombstones", conv, arr);
            tx.exec_prepared("im_erase_edits", conv, arr);
            tx.exec_prepared("im_erase_attachments", conv, arr);
            tx.exec_prepared("im_erase_events", conv, arr);
            // The erase's recalls are marked too: "erased" on a recall says
            // its target's content is gone (clients drop what they stored).
            if (!recalls.empty()) tx.exec_prepared("im_erase_events", conv, text_array(recalls));
            if (faults_.hit("store.erase_before_commit") == FaultKind::unavailable)
                throw std::runtime_error("erase: injected fault before the commit");
            if (hi) admin_note(tx, after_commit_, "e " + conv + " " + std::to_string(hi) + (lo < hi ? " " + std::to_string(lo) : ""));
            tx.commit();
            out.events += static_cast<std::int64_t>(rows.size());
            if (static_cast<std::int64_t>(rows.size()) < batch) break;
        }
        ++out.convs;
    }
    {
        pqxx::work tx(c);
        out.uploads = static_cast<std::int64_t>(tx.exec_prepared("im_erase_uploads", user).affected_rows());
        tx.commit();
    }
    return out;
}

} // namespace im
