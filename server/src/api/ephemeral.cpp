// Contract section 13's requests, typing and presence: the handlers and the
// typing limiter (no database session of their own, so the in-memory
// fuzz_session links them without the presence tracker in presence.cpp).
#include "api/presence.hpp"

#include <algorithm>

namespace im {

bool TypingLimiter::take(const std::string& device, const std::string& conv, Clock::time_point now) {
    constexpr auto window = std::chrono::seconds(1);
    std::lock_guard lk(mu_);
    // Entries idle for a window forget nothing that matters: drop them now
    // and then, so the map holds only the pairs typing this second.
    if (now - pruned_ >= std::chrono::seconds(10)) {
        for (auto it = recent_.begin(); it != recent_.end();)
            it = now - it->second.back() >= window ? recent_.erase(it) : std::next(it);
        pruned_ = now;
    }
    auto [it, fresh] = recent_.try_emplace(device + '\n' + conv);
    auto& times = it->second;
    if (!fresh && now - times.front() < window) return false;
    if (fresh) times.fill(now - window);
    std::rotate(times.begin(), times.begin() + 1, times.end());
    times.back() = now;
    return true;
}

Handled handle_typing(ApiContext& ctx, SessionStore& db, const Identity& who, const req::Typing& r,
                      const std::optional<std::string>& rid) {
    auto pushed = db.typing_gate(who, r.conv);
    if (!pushed) return error_reply(pushed.error(), rid);
    // A large conversation gets no typing at all (contract 13); a lost
    // typing frame is harmless, so the reply never waits for the bus.
    // The lab's negative control rule.typing_push_full forwards it anyway.
    if ((pushed.value() || ctx.faults.broken("rule.typing_push_full")) && ctx.bus) {
        if (!ctx.typing || ctx.typing->take(who.device, r.conv, TypingLimiter::Clock::now())) {
            if (ctx.metrics) ++ctx.metrics->typing_forwarded;
            ctx.bus->publish({"t " + r.conv + " " + who.user + (r.on ? " 1" : " 0")}, [](bool) {});
        } else if (ctx.metrics) {
            ++ctx.metrics->typing_dropped;
        }
    }
    Handled h;
    h.frame = encode_reply(TypingOk{}, rid);
    return h;
}

Handled handle_presence(SessionStore& db, const Identity& who, const req::Presence& r,
                        const std::optional<std::string>& rid) {
    auto o = db.presence(who, r.users);
    if (!o) return error_reply(o.error(), rid);
    Handled h;
    // The watch list is what the answer shows: strangers stay unwatched.
    std::vector<std::string> watch;
    for (const auto& p : o->users) watch.push_back(p.user);
    h.frame = encode_reply(o.value(), rid);
    h.watch = std::move(watch);
    return h;
}

} // namespace im
