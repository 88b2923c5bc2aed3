#include "logging_p.h"

namespace im {
Q_LOGGING_CATEGORY(lcClient, "im.sdk.client", QtInfoMsg)
Q_LOGGING_CATEGORY(lcConnection, "im.sdk.connection", QtInfoMsg)
Q_LOGGING_CATEGORY(lcOutbox, "im.sdk.outbox", QtInfoMsg)
Q_LOGGING_CATEGORY(lcStorage, "im.sdk.storage", QtInfoMsg)
Q_LOGGING_CATEGORY(lcSync, "im.sdk.sync", QtInfoMsg)
Q_LOGGING_CATEGORY(lcMarkers, "im.sdk.markers", QtInfoMsg)
} // namespace im
