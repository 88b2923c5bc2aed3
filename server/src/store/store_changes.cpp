// The store's edit and react (contract section 12): one call of the
// server-side function im_change (schema/functions/im_change.sql) per
// request, autocommit: the checks, the event and the aggregates the reads
// show, in one statement and one round trip. On the gateway, edits and
// reacts ride the send scheduler's runs instead (Store::send_group,
// im_write_group, which calls im_change per item inside the group's
// statement); these two serve an edit with an empty body, the lab
// (--enable-faults) and the item-by-item fallback. change_outcome below is
// the one mapping of im_change's codes for both.
#include "store/lab_schema.hpp"
#include "store/store_internal.hpp"

#include <string_view>

namespace im {

using namespace store_detail;

namespace {

// `function`: im_change, or the lab's variant of it (lab_schema.hpp).
std::string change_sql(const std::string& function) {
    return "SELECT r_code, r_seq, r_dup, r_changed, r_epoch FROM " + function +
           "($1, $2, $3, $4, $5, $6, $7::bigint, $8, $9, $10::boolean)";
}

} // namespace

Outcome<Store::SendResult> store_detail::change_outcome(const std::string& conv, const pqxx::field& code_field,
                                                        const pqxx::field& seq, const pqxx::field& dup,
                                                        const pqxx::field& changed, const pqxx::field& epoch) {
    const std::string_view code = code_field.c_str();
    if (code == "OK") {
        Store::SendResult r;
        r.sent.conv = conv;
        if (!seq.is_null()) r.sent.seq = seq.as<std::int64_t>();
        r.sent.dup = dup.as<bool>();
        r.changed = changed.as<bool>();
        r.sent.epoch = epoch.as<std::int64_t>();
        return r;
    }
    if (code == "NOT_MEMBER") return not_member();
    if (code == "MUTED") return muted();
    if (code == "UNAUTHENTICATED") return device_revoked();
    if (code == "IDEMPOTENCY_MISMATCH") return Error{Code::idempotency_mismatch, "cmid already used with different content"};
    if (code == "ORIGINAL_EXPIRED") return Error{Code::original_expired, "the original was purged by retention"};
    if (code == "NOT_FOUND") return Error{Code::not_found, "no such event"};
    if (code == "INVALID_ARGUMENT") return invalid("the target is not a msg event");
    if (code == "NOT_SENDER") return Error{Code::not_sender, "only the sender may edit"};
    if (code == "ALREADY_RECALLED") return Error{Code::already_recalled, "the target was recalled"};
    if (code == "EDIT_WINDOW_EXPIRED") return Error{Code::edit_window_expired, "past the edit window"};
    if (code == "TOO_MANY_EMOJI")
        return invalid("at most " + std::to_string(max_reactions) + " distinct emoji per user per message");
    throw std::runtime_error("im_change: unknown result code " + std::string(code));
}

namespace {

Outcome<Store::SendResult> run_change(pqxx::connection_base& c, const std::string& function, const Identity& who,
                              const char* kind, const std::string& conv, const std::string& cmid, std::int64_t target,
                              const std::string& body, const std::string& emoji, bool on) {
    c.prepare(function, change_sql(function));
    pqxx::nontransaction tx(c); // autocommit: the call is the transaction
    auto r = tx.exec_prepared(function, std::string(kind), who.device, who.token_sha256, conv, who.user, cmid,
                              target, body, emoji, on);
    if (r.size() != 1) throw std::runtime_error("im_change: not one result row");
    return change_outcome(conv, r[0][0], r[0][1], r[0][2], r[0][3], r[0][4]);
}

} // namespace

std::string Store::change_function() { return faults_.enabled() ? lab_change_function(faults_) : "im_change"; }

// contract section 12: "Body limits as for send (empty allowed only when
// the target has attachments)". An empty body passes the codec; here it
// needs a target that is a msg with attachments the caller may read (a
// msg's attachments never change, so this needs no lock; im_change then
// runs every other check). Anything else answers as the codec did before:
// INVALID_ARGUMENT, whether the target exists or not (nothing is revealed
// of a message the caller may not read).
namespace {
bool empty_edit_allowed(pqxx::connection_base& c, const Identity& who, const req::Edit& e) {
    c.prepare("im_edit_empty_ok",
              "SELECT EXISTS (SELECT 1 FROM events ev WHERE ev.conv_id = $1 AND ev.seq = $2 AND ev.kind = 'msg' "
              "AND ev.attachments IS NOT NULL AND EXISTS (SELECT 1 FROM membership_periods m WHERE m.conv_id = $1 "
              "AND m.user_id = $3 AND m.from_seq <= $2 AND (m.to_seq IS NULL OR m.to_seq >= $2)))");
    pqxx::read_transaction tx(c);
    return tx.exec_prepared("im_edit_empty_ok", e.conv, e.target, who.user)[0][0].as<bool>();
}
} // namespace

Outcome<Edited> Store::edit(pqxx::connection_base& c, const Identity& who, const req::Edit& e) {
    return guarded<Edited>("edit", [&]() -> Outcome<Edited> {
        if (e.body.empty() && !empty_edit_allowed(c, who, e))
            return invalid("field 'body' must be 1-4000 code points (empty only for a message with attachments)");
        auto o = run_change(c, change_function(), who, "edit", e.conv, e.cmid, e.target, e.body, "", false);
        if (!o) return o.error();
        return Edited{e.conv, o->sent.seq, o->sent.dup, o->sent.epoch};
    });
}

Outcome<Reacted> Store::react(pqxx::connection_base& c, const Identity& who, const req::React& r) {
    return guarded<Reacted>("react", [&]() -> Outcome<Reacted> {
        auto o = run_change(c, change_function(), who, "reaction", r.conv, r.cmid, r.target, "", r.emoji, r.on);
        if (!o) return o.error();
        return Reacted{r.conv, o->sent.seq ? std::optional<std::int64_t>(o->sent.seq) : std::nullopt, o->sent.dup,
                       o->changed, o->sent.epoch};
    });
}

} // namespace im
