// The SDK's logging categories (QLoggingCategory), all under "im.sdk":
//   im.sdk.client      every error the client reports (warning)
//   im.sdk.connection  connect, welcome, refusals, liveness, reconnects
//   im.sdk.outbox      retries and final verdicts of outbox entries
//   im.sdk.storage     opening and locking the store
//   im.sdk.sync        resets and rebuilds (info), history windows and gaps
//                      (info), pages, pushes out of order, walks (debug)
//   im.sdk.markers     delivered / read markers sent and confirmed (debug)
// Enable with QT_LOGGING_RULES="im.sdk.*.debug=true" (or
// QLoggingCategory::setFilterRules); info and warnings are on by default.
#pragma once

#include <QtCore/QLoggingCategory>

namespace im {
Q_DECLARE_LOGGING_CATEGORY(lcClient)
Q_DECLARE_LOGGING_CATEGORY(lcConnection)
Q_DECLARE_LOGGING_CATEGORY(lcOutbox)
Q_DECLARE_LOGGING_CATEGORY(lcStorage)
Q_DECLARE_LOGGING_CATEGORY(lcSync)
Q_DECLARE_LOGGING_CATEGORY(lcMarkers)
} // namespace im
