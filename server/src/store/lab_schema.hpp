// The acceptance lab's broken variants of the send function and of the
// ack/read statements (its negative controls, docs/acceptance.md).
// Production SQL carries no lab switch nor lab parameter: schema/functions/im_send.sql reads no setting. Each variant is
// a separate function, im_lab_send_<rule>, derived from that file's text by
// exact text edits of the rule's places (each must match exactly once), and installed only by a gateway started with
// --enable-faults into a database the lab created (lab_marker). A gateway
// without --enable-faults never calls one; a setting in the --db URL,
// PGOPTIONS or ALTER ROLE/DATABASE SET cannot select one.
#pragma once

#include "core/faults.hpp"

#include <string>
#include <string_view>

#include <pqxx/pqxx>

namespace im {

/// Creates (or replaces) every im_lab_send_<rule> variant (and the
/// im_lab_change_<rule> ones of im_change.sql), under the schema lock.
/// Throws when an edit no longer matches its file exactly once.
void install_lab_send_functions(pqxx::connection_base& c);

/// A production statement with one of its rules turned off (its exact text
/// `rule` replaced by `off`): the lab's variant of it, for the negative
/// control of `variant` (e.g. the ack and read statements without their
/// install rule, prepared by Store::ack and Store::read only while
/// rule.stale_install is armed, which needs --enable-faults). Throws when
/// `sql` no longer has `rule` exactly once, so a rewrite cannot silently
/// disarm a control.
std::string lab_rule_off(std::string sql, std::string_view rule, std::string_view off, std::string_view variant);

/// The send function for this call: "im_send", or the variant that breaks
/// the armed rule.send_* point (consumes one COUNT of it), or, with
/// `no_lock` (--lab-no-unique-index), the variant without the row lock.
/// Throws when two are asked for at once (the lab arms one at a time).
std::string lab_send_function(FaultRegistry& faults, bool no_lock);

/// The edit/react function for this call: "im_change", or its variant
/// im_lab_change_<rule> when rule.edit_window or rule.react_noop is armed.
std::string lab_change_function(FaultRegistry& faults);

} // namespace im
