#include "panelutil.h"

#include <im/client.h>

#include <QtCore/QDateTime>
#include <QtCore/QObject>
#include <QtWidgets/QHeaderView>
#include <QtWidgets/QTableView>

QTableView *makeTable(const QString &objectName) {
    auto *v = new QTableView;
    v->setObjectName(objectName);
    v->setSelectionBehavior(QAbstractItemView::SelectRows);
    v->setSelectionMode(QAbstractItemView::SingleSelection);
    v->setEditTriggers(QAbstractItemView::NoEditTriggers);
    v->setWordWrap(false);
    v->verticalHeader()->setVisible(false);
    v->verticalHeader()->setDefaultSectionSize(v->fontMetrics().height() + 8);
    v->horizontalHeader()->setHighlightSections(false);
    return v;
}

QString relativeTime(const QDateTime &when) {
    if (!when.isValid())
        return QStringLiteral("-");
    const qint64 ms = QDateTime::currentDateTimeUtc().msecsTo(when);
    if (ms <= 0)
        return QStringLiteral("now");
    return QStringLiteral("in %1 s").arg(double(ms) / 1000.0, 0, 'f', 1);
}

QString cancelOutboxEntry(im::Client *client, const QString &cmid) {
    const bool ok = client->cancel(cmid);
    return ok ? QObject::tr("Cancelled %1: it never left, it is gone from the outbox and the timeline").arg(cmid)
              : QObject::tr("Not cancelled: %1").arg(client->lastError());
}

QString discardMessage(im::Client *client, const QString &cmid) {
    const bool ok = !cmid.isEmpty() && client->discard(cmid);
    return ok ? QObject::tr("Discarded %1").arg(cmid)
              : QObject::tr("Not discarded: %1")
                    .arg(cmid.isEmpty() ? QObject::tr("not one of your messages") : client->lastError());
}
