#include <im/conversationlistmodel.h>

#include "clientlink_p.h"
#include <im/client.h>

#include "client_p.h"
#include "modelroles_p.h"
#include "rowdiff_p.h"

#include <QtCore/QPointer>
#include <QtCore/QTimer>

namespace im {

namespace {
struct ConvItem {
    detail::ConvRow row;
    bool operator==(const ConvItem &o) const {
        const auto &a = row;
        const auto &b = o.row;
        return a.conv == b.conv && a.kind == b.kind && a.epoch == b.epoch && a.after == b.after && a.head == b.head
               && a.delivered == b.delivered && a.read == b.read && a.unread == b.unread && a.gapTo == b.gapTo
               && a.lastTs == b.lastTs;
    }
};
} // namespace

class ConversationListModelPrivate {
public:
    QPointer<Client> client;
    QList<ConvItem> rows;
    QTimer reload;
    QList<QMetaObject::Connection> links; // to the current client
};

ConversationListModel::ConversationListModel(Client *client, QObject *parent)
    : QAbstractListModel(parent), d(std::make_unique<ConversationListModelPrivate>()) {
    d->reload.setSingleShot(true);
    d->reload.setInterval(20);
    connect(&d->reload, &QTimer::timeout, this, &ConversationListModel::refresh);
    setClient(client);
    if (!client)
        refresh();
}

ConversationListModel::~ConversationListModel() = default;

Client *ConversationListModel::client() const { return d->client.data(); }

void ConversationListModel::setClient(Client *client) {
    if (!detail::relink(d->client, d->links, client))
        return;
    if (client) {
        // Private signals only (an app may disconnect() its Client).
        ClientPrivate *cp = ClientPrivate::get(client);
        d->links << connect(cp, &ClientPrivate::conversationsChanged, this, [this] {
            if (!d->reload.isActive())
                d->reload.start();
        });
        // Typing lives in memory (Ephemeral), not in the store: one row's
        // role changes, nothing is re-read.
        d->links << connect(cp, &ClientPrivate::typingChanged, this, [this](const QString &conv) {
            if (const int row = indexOf(conv); row >= 0)
                emit dataChanged(index(row), index(row), {TypingRole});
        });
        d->links << connect(cp, &ClientPrivate::aboutToBeDestroyed, this, [this] { setClient(nullptr); });
    }
    refresh();
    emit clientChanged();
}

int ConversationListModel::count() const { return int(d->rows.size()); }

void ConversationListModel::refresh() {
    d->reload.stop();
    QList<ConvItem> fresh;
    if (d->client) {
        ClientPrivate *cp = ClientPrivate::get(d->client.data());
        if (cp->storage.isOpen()) {
            std::optional<QList<detail::ConvRow>> rows = cp->storage.conversations();
            if (!rows) {
                cp->storageFailed(QStringLiteral("cannot read conversations"));
                return;
            }
            for (const detail::ConvRow &r : *rows)
                fresh.append(ConvItem{r});
        }
    }
    const int before = int(d->rows.size());
    detail::RowDiffOps ops;
    ops.beginRemove = [this](int a, int b) { beginRemoveRows({}, a, b); };
    ops.endRemove = [this] { endRemoveRows(); };
    ops.beginInsert = [this](int a, int b) { beginInsertRows({}, a, b); };
    ops.endInsert = [this] { endInsertRows(); };
    ops.beginReset = [this] { beginResetModel(); };
    ops.endReset = [this] { endResetModel(); };
    ops.changed = [this](int r) { emit dataChanged(index(r), index(r)); };
    // A conversation with new activity moves up: a row move, not a reset.
    ops.beginMove = [this](int from, int to) { beginMoveRows({}, from, from, {}, to); };
    ops.endMove = [this] { endMoveRows(); };
    detail::applyRowDiff(d->rows, fresh, [](const ConvItem &r) { return r.row.conv; }, ops);
    if (before != int(d->rows.size()))
        emit countChanged();
}

int ConversationListModel::rowCount(const QModelIndex &parent) const {
    return parent.isValid() ? 0 : int(d->rows.size());
}

QVariant ConversationListModel::data(const QModelIndex &index, int role) const {
    if (!index.isValid() || index.row() < 0 || index.row() >= d->rows.size())
        return {};
    const detail::ConvRow &r = d->rows.at(index.row()).row;
    switch (role) {
    case Qt::DisplayRole:
    case ConvRole: return r.conv;
    case KindRole: return r.kind;
    case HeadRole: return r.head;
    case UnreadRole: return r.unread;
    case ReadRole: return r.read;
    case DeliveredRole: return r.delivered;
    case EpochRole: return r.epoch;
    case HasGapRole: return r.gapTo > 0;
    case CursorRole: return r.after;
    case LastTimestampRole: return r.lastTs > 0 ? QDateTime::fromMSecsSinceEpoch(r.lastTs) : QDateTime();
    case TypingRole: return d->client ? d->client->typingUsers(r.conv) : QStringList();
    default: return {};
    }
}

QVariant ConversationListModel::get(int row, int role) const { return data(index(row), role); }

QVariant ConversationListModel::get(int row, const QString &roleName) const {
    return detail::valueByRoleName(this, row, roleName);
}

QVariantMap ConversationListModel::get(int row) const { return detail::rowByRoleName(this, row); }

int ConversationListModel::indexOf(const QString &conv) const {
    for (int i = 0; i < d->rows.size(); ++i)
        if (d->rows[i].row.conv == conv)
            return i;
    return -1;
}

QHash<int, QByteArray> ConversationListModel::roleNames() const {
    return {{ConvRole, "conv"},       {KindRole, "kind"},         {HeadRole, "head"},
            {UnreadRole, "unread"},   {ReadRole, "read"},         {DeliveredRole, "delivered"},
            {EpochRole, "epoch"},     {HasGapRole, "hasGap"},     {CursorRole, "cursor"},
            {LastTimestampRole, "lastTimestamp"}, {TypingRole, "typing"}};
}

} // namespace im
