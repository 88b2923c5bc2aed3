// The private part of im::OutboxEntry (im/types.h): what Outbox::toEntry()
// fills. Not installed: a field added here changes no app's ABI.
#pragma once

#include <im/types.h>

#include <QtCore/QSharedData>

namespace im {

class OutboxEntryData : public QSharedData {
public:
    QString cmid, conv, kind, body;
    qint64 target = 0;
    int attempts = 0;
    QString lastError;
    QDateTime nextRetryAt, createdAt;
    bool inFlight = false;
    QString prev;
    bool held = false;
    qint64 replyTo = 0;
    QString emoji;
    bool on = false;
    QString targetCmid;
};

} // namespace im
