#include "api/api.hpp"

#include "api/presence.hpp"
#include "api/send_scheduler.hpp"

#include "core/log.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <future>

namespace im {

Handled error_reply(const Error& e, const std::optional<std::string>& rid, std::optional<std::int64_t> retry_ms) {
    Handled h;
    h.frame = encode_error(e, rid, retry_ms);
    h.code = std::string(code_name(e.code));
    h.close_after = e.code == Code::unauthenticated || e.code == Code::stale_install;
    return h;
}

namespace {

template <class T>
Handled reply(const Outcome<T>& o, const std::optional<std::string>& rid) {
    if (!o) return error_reply(o.error(), rid);
    Handled h;
    h.frame = encode_reply(Reply{o.value()}, rid);
    return h;
}

std::int64_t now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

// Lab negative control only (rule.recall_dedup): the recall under a key no
// request ever used, so the store's request-key lookup never finds it.
req::Recall lab_fresh_key(req::Recall r) {
    static std::atomic<long long> n{0};
    r.cmid = "lab-recall-dedup-" + std::to_string(now_ms()) + "-" + std::to_string(++n);
    return r;
}

} // namespace

// Contract section 6, send step 5: the notification is handed to the bus
// after COMMIT and before the reply. A bus that cannot take it turns the
// reply into UNAVAILABLE: the resend is a duplicate and publishes again.
Error unpublished() { return unavailable("committed, but the notification could not be published; resend"); }

Outcome<jwt::Claims> check_jwt(const ApiContext& ctx, const std::string& token) {
    if (!ctx.jwt) return Error{Code::unauthenticated, "signed tokens are not enabled on this server"};
    const auto now_s = std::chrono::duration_cast<std::chrono::seconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
    auto v = ctx.jwt->verify(token, now_s);
    if (auto* r = std::get_if<jwt::Refusal>(&v)) {
        log_info("jwt_refused", {{"reason", r->reason}});
        return Error{Code::unauthenticated, "invalid token"};
    }
    return std::get<jwt::Claims>(std::move(v));
}

std::int64_t RefreshBudget::take(std::chrono::steady_clock::time_point now) {
    constexpr auto window = std::chrono::minutes(1);
    if (used_ == recent_.size()) {
        const auto oldest = recent_[next_];
        if (now - oldest < window)
            return std::max<std::int64_t>(
                1, std::chrono::ceil<std::chrono::milliseconds>(oldest + window - now).count());
    } else {
        ++used_;
    }
    recent_[next_] = now;
    next_ = (next_ + 1) % recent_.size();
    return 0;
}

// refresh (section 4a): a valid JWT for the same user and device moves the
// connection's exp; anything else is UNAUTHENTICATED and closes. A
// connection opened with a random device token has no `sub` to match: its
// refresh is refused the same way (docs/protocol.md). Over the budget, no
// signature is checked: RATE_LIMITED, the connection stays open.
Handled handle_refresh(const ApiContext& ctx, RefreshBudget& budget, const Identity& who, const req::Refresh& r,
                       const std::optional<std::string>& rid, std::optional<std::int64_t>& new_exp_ms) {
    if (!who.token_exp_ms)
        return error_reply({Code::unauthenticated, "refresh needs a connection opened with a signed token"}, rid);
    if (const auto wait_ms = budget.take(std::chrono::steady_clock::now())) {
        log_info("refresh_rate_limited", {{"device", who.device}, {"retry_ms", static_cast<long>(wait_ms)}});
        const Error e{Code::rate_limited, "at most " + std::to_string(refresh_per_minute) +
                                              " refreshes per connection per minute"};
        Handled h;
        h.frame = encode_error(e, rid, wait_ms);
        h.code = std::string(code_name(e.code));
        return h;
    }
    auto claims = check_jwt(ctx, r.token);
    if (!claims) return error_reply(claims.error(), rid);
    if (claims->sub != who.user || claims->device != who.device)
        return error_reply({Code::unauthenticated, "token is for another user or device"}, rid);
    new_exp_ms = claims->exp_ms;
    Handled h;
    h.frame = encode_reply(Refreshed{claims->exp_ms}, rid);
    return h;
}

std::optional<Handled> out_of_order(const std::optional<Identity>& who, const Request& req,
                                    const std::optional<std::string>& rid) {
    const bool hello = std::holds_alternative<req::Hello>(req);
    if (hello && who) return error_reply(invalid("already authenticated"), rid);
    if (hello || who) return std::nullopt;
    Handled h = error_reply({Code::unauthenticated, "send hello first"}, rid);
    h.close_after = false; // only a failed hello closes the connection
    return h;
}

Handled handle_request(ApiContext& ctx, SessionStore* db, const std::optional<Identity>& who, const Request& req,
                       const std::optional<std::string>& rid) {
    if (auto refused = out_of_order(who, req, rid)) return std::move(*refused);
    if (!db) return error_reply(unavailable("database unreachable, retry with the same request"), rid);
    return std::visit(
        [&](const auto& r) -> Handled {
            using T = std::decay_t<decltype(r)>;
            if constexpr (std::is_same_v<T, req::Hello>) {
                std::optional<Outcome<Identity>> o;
                // No token can be empty or longer than max_token_chars: the
                // unknown token's answer, without a lookup (contract 4).
                if (r.token.empty() || r.token.size() > max_token_chars)
                    return error_reply({Code::unauthenticated, "unknown or revoked device token"}, rid);
                if (jwt::looks_like_jwt(r.token)) {
                    auto claims = check_jwt(ctx, r.token);
                    if (!claims) return error_reply(claims.error(), rid);
                    o = db->hello_jwt(claims->sub, claims->device, r.install, claims->exp_ms);
                } else {
                    o = db->hello(r);
                }
                if (!*o) return error_reply(o->error(), rid);
                Handled h;
                h.frame = encode_reply(Welcome{(*o)->user, (*o)->device, ctx.gateway_id, now_ms()}, rid);
                h.identity = o->value();
                return h;
            } else if constexpr (std::is_same_v<T, req::Send>) {
                return send_run_and_wait(ctx, db, *who, {r}, {rid}).front();
            } else if constexpr (std::is_same_v<T, req::Sync>) {
                return reply(db->sync(*who, r), rid);
            } else if constexpr (std::is_same_v<T, req::Ack>) {
                return reply(db->ack(*who, r), rid);
            } else if constexpr (std::is_same_v<T, req::Read> || std::is_same_v<T, req::Recall> ||
                                 std::is_same_v<T, req::Edit> || std::is_same_v<T, req::React>) {
                auto promise = std::make_shared<std::promise<Handled>>();
                auto result = promise->get_future();
                handle_request(ctx, db, who, req, rid, [promise](Handled h) { promise->set_value(std::move(h)); });
                return result.get();
            } else if constexpr (std::is_same_v<T, req::Convs>) {
                return reply(db->convs(*who, r), rid);
            } else if constexpr (std::is_same_v<T, req::History>) {
                return reply(db->history(*who, r), rid);
            } else if constexpr (std::is_same_v<T, req::Fetch>) {
                return reply(db->fetch(*who, r), rid);
            } else if constexpr (std::is_same_v<T, req::Typing>) {
                return handle_typing(ctx, *db, *who, r, rid);
            } else if constexpr (std::is_same_v<T, req::Presence>) {
                return handle_presence(*db, *who, r, rid);
            } else {
                // sub is answered on the I/O thread; nothing else reaches here.
                return error_reply(invalid("unexpected request"), rid);
            }
        },
        req);
}

namespace {

// The recall is durable (and published) now; this point tests replies lost after it.
Handled recall_reply(ApiContext& ctx, const Outcome<Recalled>& o, const std::optional<std::string>& rid) {
    auto f = ctx.faults.hit("api.after_recall_commit");
    if (f == FaultKind::unavailable) return error_reply(unavailable("injected fault"), rid);
    if (f == FaultKind::drop_reply) {
        Handled h;
        h.code = "DROPPED";
        return h;
    }
    return reply(o, rid);
}

} // namespace

void handle_request(ApiContext& ctx, SessionStore* db, const std::optional<Identity>& who, const Request& req,
                    const std::optional<std::string>& rid, std::function<void(Handled)> done) {
    // read and recall commit, then hand their notification to the bus; the
    // worker is free once they committed (the bus answers on its own thread).
    if (db && who) {
        if (const auto* r = std::get_if<req::Read>(&req)) {
            Notes notes;
            auto o = db->read(*who, *r, notes);
            Handled h = reply(o, rid);
            if (notes.empty() || !ctx.bus) return done(std::move(h));
            // A lost hint is healed by the next convs: the reply stands either way.
            ctx.bus->publish(std::move(notes),
                             [h = std::move(h), done = std::move(done)](bool) mutable { done(std::move(h)); });
            return;
        }
        if (const auto* r = std::get_if<req::Recall>(&req)) {
            auto o = ctx.faults.broken("rule.recall_dedup") ? db->recall(*who, lab_fresh_key(*r)) : db->recall(*who, *r);
            if (!o) return done(error_reply(o.error(), rid));
            if (!ctx.bus) return done(recall_reply(ctx, o, rid));
            Notes notes{"e " + o->conv + " " + std::to_string(o->seq)};
            ctx.bus->publish(std::move(notes), [&ctx, o, rid, done = std::move(done)](bool published) {
                done(published ? recall_reply(ctx, o, rid) : error_reply(unpublished(), rid));
            });
            return;
        }
    }
    if (db && who) {
        // edit and react (contract section 12): committed in the store, then
        // published as a send is, a duplicate again, before the reply.
        std::optional<Outcome<Edited>> edited;
        std::optional<Outcome<Reacted>> reacted;
        if (const auto* r = std::get_if<req::Edit>(&req)) edited = db->edit(*who, *r);
        else if (const auto* r = std::get_if<req::React>(&req)) reacted = db->react(*who, *r);
        if (edited || reacted) {
            Handled h = edited ? reply(*edited, rid) : reply(*reacted, rid);
            std::optional<std::int64_t> seq;
            std::string conv;
            if (edited && *edited) seq = (*edited)->seq, conv = (*edited)->conv;
            if (reacted && *reacted && (*reacted)->seq && ((*reacted)->changed || (*reacted)->dup))
                seq = (*reacted)->seq, conv = (*reacted)->conv;
            if (!seq || !ctx.bus) return done(std::move(h));
            ctx.bus->publish(Notes{"e " + conv + " " + std::to_string(*seq)},
                             [h = std::move(h), rid, done = std::move(done)](bool published) mutable {
                                 done(published ? std::move(h) : error_reply(unpublished(), rid));
                             });
            return;
        }
    }
    done(handle_request(ctx, db, who, req, rid));
}

} // namespace im
