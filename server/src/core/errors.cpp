#include "core/errors.hpp"

namespace im {

std::string_view code_name(Code c) {
    switch (c) {
    case Code::invalid_argument: return "INVALID_ARGUMENT";
    case Code::unauthenticated: return "UNAUTHENTICATED";
    case Code::not_member: return "NOT_MEMBER";
    case Code::idempotency_mismatch: return "IDEMPOTENCY_MISMATCH";
    case Code::original_expired: return "ORIGINAL_EXPIRED";
    case Code::not_sender: return "NOT_SENDER";
    case Code::already_recalled: return "ALREADY_RECALLED";
    case Code::recall_window_expired: return "RECALL_WINDOW_EXPIRED";
    case Code::not_found: return "NOT_FOUND";
    case Code::cursor_ahead: return "CURSOR_AHEAD";
    case Code::epoch_changed: return "EPOCH_CHANGED";
    case Code::stale_install: return "STALE_INSTALL";
    case Code::unavailable: return "UNAVAILABLE";
    case Code::rate_limited: return "RATE_LIMITED";
    case Code::muted: return "MUTED";
    case Code::edit_window_expired: return "EDIT_WINDOW_EXPIRED";
    }
    return "UNAVAILABLE";
}

} // namespace im
