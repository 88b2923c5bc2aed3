#include <im/messagelistmodel.h>

#include <im/client.h>

#include "client_p.h"
#include "rowdiff_p.h"

#include <QtCore/QTimer>

namespace im {

class MessageListModelPrivate {
public:
    QPointer<Client> client;
    QString conv;
    QList<detail::MessageRow> rows;
    QTimer reload;
};

MessageListModel::MessageListModel(Client *client, const QString &conversation, QObject *parent)
    : QAbstractListModel(parent), d(std::make_unique<MessageListModelPrivate>()) {
    d->client = client;
    d->conv = conversation;
    d->reload.setSingleShot(true);
    d->reload.setInterval(20); // coalesce bursts (a page, a resend storm) into one reload
    connect(&d->reload, &QTimer::timeout, this, &MessageListModel::refresh);
    if (client) {
        connect(ClientPrivate::get(client), &ClientPrivate::timelineChanged, this, [this](const QString &c) {
            if (c == d->conv && !d->reload.isActive())
                d->reload.start();
        });
        connect(client, &Client::identityChanged, this, [this] { d->reload.start(); });
        connect(client, &QObject::destroyed, this, [this] {
            beginResetModel();
            d->rows.clear();
            endResetModel();
        });
    }
    refresh();
}

MessageListModel::~MessageListModel() = default;

QString MessageListModel::conversation() const { return d->conv; }

void MessageListModel::setConversation(const QString &conv) {
    if (conv == d->conv)
        return;
    d->conv = conv;
    beginResetModel();
    d->rows.clear();
    endResetModel();
    emit conversationChanged();
    refresh();
}

int MessageListModel::count() const { return int(d->rows.size()); }

void MessageListModel::refresh() {
    d->reload.stop();
    QList<detail::MessageRow> fresh;
    if (d->client && !d->conv.isEmpty()) {
        ClientPrivate *cp = ClientPrivate::get(d->client.data());
        if (cp->storage.isOpen()) {
            std::optional<QList<detail::MessageRow>> rows = cp->storage.messages(d->conv, cp->userId);
            if (!rows) {
                cp->storageFailed(QStringLiteral("cannot read messages"));
                return;
            }
            fresh = std::move(*rows);
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
    detail::applyRowDiff(d->rows, fresh, [](const detail::MessageRow &r) { return r.key(); }, ops);
    if (before != int(d->rows.size()))
        emit countChanged();
}

int MessageListModel::rowCount(const QModelIndex &parent) const {
    return parent.isValid() ? 0 : int(d->rows.size());
}

QVariant MessageListModel::data(const QModelIndex &index, int role) const {
    if (!index.isValid() || index.row() < 0 || index.row() >= d->rows.size())
        return {};
    const detail::MessageRow &r = d->rows.at(index.row());
    switch (role) {
    case Qt::DisplayRole:
    case BodyRole: return r.body;
    case SenderRole: return r.sender;
    case SeqRole: return r.seq;
    case StateRole: return r.state;
    case ErrorCodeRole: return r.errorCode;
    case CmidRole: return r.cmid;
    case TimestampRole: return QDateTime::fromMSecsSinceEpoch(r.ts);
    case KindRole: return r.kind;
    case DupRole: return r.dup;
    case IsOwnRole: return r.own;
    case UserRole: return r.user;
    default: return {};
    }
}

QVariant MessageListModel::get(int row, int role) const { return data(index(row), role); }

QHash<int, QByteArray> MessageListModel::roleNames() const {
    return {{BodyRole, "body"},         {SenderRole, "sender"}, {SeqRole, "seq"},
            {StateRole, "state"},       {ErrorCodeRole, "errorCode"}, {CmidRole, "cmid"},
            {TimestampRole, "timestamp"}, {KindRole, "kind"},   {DupRole, "dup"},
            {IsOwnRole, "isOwn"},       {UserRole, "user"}};
}

} // namespace im
