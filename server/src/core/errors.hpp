// Error codes of the contract (section 8) and the small Outcome type the
// store returns. Pure: no I/O, no JSON.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace im {

enum class Code {
    invalid_argument,
    unauthenticated,
    not_member,
    idempotency_mismatch,
    original_expired,
    not_sender,
    already_recalled,
    recall_window_expired,
    not_found,
    cursor_ahead,
    epoch_changed,
    stale_install,
    unavailable,
    rate_limited, // contract v3 section 13; the error frame carries retry_ms
    edit_window_expired, // contract v3 section 12: past the edit window (database clock)
    muted,               // server.md moderation: the caller is muted in this conversation (terminal)
};

std::string_view code_name(Code c);

/// C6: only UNAVAILABLE (and, contract v3, RATE_LIMITED after its
/// retry_ms) is retryable; every other code is terminal.
constexpr bool is_retryable(Code c) { return c == Code::unavailable || c == Code::rate_limited; }

struct Error {
    Code code;
    std::string msg;
};

/// C4: the one message for "unknown conversation" and "not a member".
inline constexpr std::string_view not_member_msg = "conversation not visible";

inline Error not_member() { return {Code::not_member, std::string(not_member_msg)}; }
inline Error invalid(std::string msg) { return {Code::invalid_argument, std::move(msg)}; }
/// server.md, moderation: send, edit, react and typing of a muted member.
inline Error muted() { return {Code::muted, "you are muted in this conversation"}; }
/// Section 4: the device was revoked or got a new token (the connection closes).
inline Error device_revoked() { return {Code::unauthenticated, "device revoked"}; }
inline Error unavailable(std::string msg = "service unavailable, retry with the same request") {
    return {Code::unavailable, std::move(msg)};
}

/// Either a value or a contract error.
template <class T>
class Outcome {
public:
    Outcome(T v) : v_(std::move(v)) {}
    Outcome(Error e) : v_(std::move(e)) {}
    bool ok() const { return v_.index() == 0; }
    explicit operator bool() const { return ok(); }
    T& value() { return std::get<0>(v_); }
    const T& value() const { return std::get<0>(v_); }
    T* operator->() { return &value(); }
    const T* operator->() const { return &value(); }
    const Error& error() const { return std::get<1>(v_); }

private:
    std::variant<T, Error> v_;
};

} // namespace im
