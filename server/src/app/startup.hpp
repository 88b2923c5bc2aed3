// The checks of a gateway's start that come before it serves: the signed-
// token keys, the lab's fault points, and the database (schema migrations and function files, the
// lab's switches only on a lab-made database, the idempotency index).
// Each returns the exit status that ends the start, or nothing to go on.
#pragma once

#include "api/jwt.hpp"
#include "core/config.hpp"
#include "core/faults.hpp"

#include <memory>
#include <optional>
#include <string>

namespace im {

/// Loads the JWT keys (--jwt-*) into `out` when signed tokens are enabled;
/// a bad key file stops the start (exit 1).
std::optional<int> load_jwt_keys(const Config& cfg, std::unique_ptr<jwt::Verifier>& out);

/// Brings the database at `url` to this build's schema and checks what a
/// gateway cannot serve without: 1 for a failure, 2 for a refused lab
/// database.
std::optional<int> prepare_database(const Config& cfg, const std::string& url);

/// Arms the --fault points (lab only); a bad one stops the start (exit 2).
std::optional<int> arm_faults(const Config& cfg, FaultRegistry& faults);

} // namespace im
