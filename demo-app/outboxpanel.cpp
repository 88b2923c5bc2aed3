#include "outboxpanel.h"

#include "panelutil.h"
#include "roletablemodel.h"

#include <im/client.h>
#include <im/outboxmodel.h>

#include <QtCore/QDateTime>
#include <QtCore/QSortFilterProxyModel>
#include <QtGui/QAction>
#include <QtGui/QColor>
#include <QtGui/QFont>
#include <QtWidgets/QHBoxLayout>
#include <QtWidgets/QHeaderView>
#include <QtWidgets/QLabel>
#include <QtWidgets/QMenu>
#include <QtWidgets/QPushButton>
#include <QtWidgets/QTableView>
#include <QtWidgets/QVBoxLayout>

using im::OutboxModel;

OutboxPanel::OutboxPanel(im::Client *client, OutboxModel *outbox, QWidget *parent)
    : QGroupBox(tr("Outbox (durable, resent with the same cmid)"), parent), client_(client), outbox_(outbox) {
    setObjectName(QStringLiteral("outboxPanel"));
    auto role = [](int r) {
        return [r](const QModelIndex &s, int role) -> QVariant {
            return role == Qt::DisplayRole ? s.data(r) : QVariant();
        };
    };
    const QList<RoleTableModel::Column> columns{
         {tr("cmid"),
          [](const QModelIndex &s, int role) -> QVariant {
              if (role == Qt::DisplayRole || role == Qt::ToolTipRole)
                  return s.data(OutboxModel::CmidRole);
              if (role == Qt::FontRole) {
                  QFont f(QStringLiteral("monospace"));
                  f.setStyleHint(QFont::Monospace);
                  return f;
              }
              return {};
          }},
         {tr("Kind"), role(OutboxModel::KindRole)},
         {tr("Conv"), role(OutboxModel::ConvRole)},
         {tr("Body / target"),
          [](const QModelIndex &s, int role) -> QVariant {
              if (role != Qt::DisplayRole)
                  return {};
              if (s.data(OutboxModel::KindRole).toString() == QLatin1String("recall"))
                  return QStringLiteral("recall seq %1").arg(s.data(OutboxModel::TargetRole).toLongLong());
              return s.data(OutboxModel::BodyRole);
          }},
         {tr("Attempts"), role(OutboxModel::AttemptsRole)},
         {tr("Last error"),
          [](const QModelIndex &s, int role) -> QVariant {
              const QString e = s.data(OutboxModel::LastErrorRole).toString();
              if (role == Qt::DisplayRole)
                  return e.isEmpty() ? QStringLiteral("-") : e;
              if (role == Qt::ForegroundRole && !e.isEmpty())
                  return QColor(0xb0, 0x00, 0x00);
              return {};
          }},
         {tr("Next retry"),
          [](const QModelIndex &s, int role) -> QVariant {
              const QDateTime t = s.data(OutboxModel::NextRetryAtRole).toDateTime();
              if (role == Qt::DisplayRole)
                  return relativeTime(t);
              if (role == Qt::ToolTipRole && t.isValid())
                  return t.toLocalTime().toString(Qt::ISODateWithMs);
              return {};
          }},
         {tr("In flight"),
          [](const QModelIndex &s, int role) -> QVariant {
              return role == Qt::DisplayRole
                         ? (s.data(OutboxModel::InFlightRole).toBool() ? QStringLiteral("yes") : QStringLiteral("no"))
                         : QVariant();
          }},
         // The pipelining order: the unanswered message this one was sent
         // behind (its `prev`), which the server must commit first.
         {tr("After (prev)"),
          [](const QModelIndex &s, int role) -> QVariant {
              const QString prev = s.data(OutboxModel::PrevRole).toString();
              if (role == Qt::DisplayRole)
                  return prev.isEmpty() ? QStringLiteral("-") : prev.left(8);
              if (role == Qt::ToolTipRole)
                  return prev.isEmpty() ? tr("sent behind nothing unanswered")
                                        : tr("sent behind %1: appended only once that one is committed").arg(prev);
              return {};
          }},
         // Obligation 10: written under another user's token, never sent here.
         {tr("Held"),
          [](const QModelIndex &s, int role) -> QVariant {
              const bool held = s.data(OutboxModel::HeldRole).toBool();
              if (role == Qt::DisplayRole)
                  return held ? QStringLiteral("held") : QStringLiteral("-");
              if (role == Qt::ToolTipRole && held)
                  return tr("written under another user's token: never sent as this window's user");
              if (role == Qt::BackgroundRole && held)
                  return QColor(0xd8, 0xd8, 0xd8);
              return {};
          }}};
    // Held drafts apart from the entries that go out (issue 48): the outbox
    // table shows what this window's user will send, a second table below
    // the held drafts (written under another user's token, never sent
    // here), shown only while there are some. One filter on HeldRole each.
    auto heldFilter = [this](bool held) {
        auto *f = new QSortFilterProxyModel(this);
        f->setSourceModel(outbox_);
        f->setFilterRole(OutboxModel::HeldRole);
        f->setFilterFixedString(held ? QStringLiteral("true") : QStringLiteral("false"));
        return f;
    };
    table_ = new RoleTableModel(heldFilter(false), columns, this);
    heldTable_ = new RoleTableModel(heldFilter(true), columns, this);
    view_ = makeTable(QStringLiteral("outboxView"));
    view_->setModel(table_);
    heldView_ = makeTable(QStringLiteral("heldView"));
    heldView_->setModel(heldTable_);
    for (QTableView *v : {view_, heldView_})
        for (int c = 0; c < table_->columnCount(); ++c)
            v->horizontalHeader()->setSectionResizeMode(c, c == OWhat ? QHeaderView::Stretch
                                                                      : QHeaderView::ResizeToContents);
    view_->setContextMenuPolicy(Qt::CustomContextMenu);
    connect(view_, &QWidget::customContextMenuRequested, this, [this](const QPoint &pos) {
        const QModelIndex idx = view_->indexAt(pos);
        if (!idx.isValid())
            return;
        const QModelIndex entry = table_->sourceIndex(idx.row());
        const QString cmid = entry.data(OutboxModel::CmidRole).toString();
        QMenu menu(this);
        menu.setObjectName(QStringLiteral("outboxMenu"));
        QAction *cancel = menu.addAction(tr("Cancel (not sent yet)"));
        cancel->setObjectName(QStringLiteral("cancelOutboxAction"));
        cancel->setEnabled(entry.data(OutboxModel::AttemptsRole).toInt() == 0);
        connect(cancel, &QAction::triggered, this, [this, cmid] { emit actionDone(cancelOutboxEntry(client_, cmid)); });
        menu.exec(view_->viewport()->mapToGlobal(pos));
    });
    depth_ = new QLabel;
    depth_->setObjectName(QStringLiteral("outboxDepth"));
    auto *cancelSelected = new QPushButton(tr("Cancel selected"));
    cancelSelected->setObjectName(QStringLiteral("cancelOutboxButton"));
    cancelSelected->setToolTip(tr("Client::cancel(): withdraws a Pending entry no attempt of which went on the wire; "
                                  "one already sent is refused (recall it once it is Sent)"));
    connect(cancelSelected, &QPushButton::clicked, this, [this] {
        const QModelIndex cur = view_->currentIndex();
        if (!cur.isValid()) {
            emit statusMessage(tr("Select an outbox entry first"), 5000);
            return;
        }
        emit actionDone(cancelOutboxEntry(client_, table_->sourceIndex(cur.row()).data(OutboxModel::CmidRole).toString()));
    });
    auto *discardHeld = new QPushButton(tr("Discard held drafts"));
    discardHeld->setObjectName(QStringLiteral("discardHeldButton"));
    discardHeld->setToolTip(tr("Client::discardHeldDrafts(): drops every draft written under another user's token "
                               "(never sent as this window's user)"));
    connect(discardHeld, &QPushButton::clicked, this, [this] {
        const int n = client_->discardHeldDrafts();
        emit actionDone(n < 0 ? tr("Held drafts not discarded: %1").arg(client_->lastError())
                              : tr("Discarded %n held draft(s)", nullptr, n));
    });
    auto *top = new QHBoxLayout;
    top->addWidget(depth_, 1);
    top->addWidget(cancelSelected);
    heldBox_ = new QWidget;
    heldBox_->setObjectName(QStringLiteral("heldBox"));
    auto *heldLabel = new QLabel(tr("<b>Held drafts</b>: written under another user's token; never sent as this "
                                    "window's user (they go out only in a session of their own user's token)"));
    heldLabel->setWordWrap(true);
    auto *heldTop = new QHBoxLayout;
    heldTop->addWidget(heldLabel, 1);
    heldTop->addWidget(discardHeld);
    auto *heldLayout = new QVBoxLayout(heldBox_);
    heldLayout->setContentsMargins(0, 0, 0, 0);
    heldLayout->addLayout(heldTop);
    heldLayout->addWidget(heldView_, 1);
    auto *l = new QVBoxLayout;
    l->addLayout(top);
    l->addWidget(view_, 2);
    l->addWidget(heldBox_, 1);
    setLayout(l);
    setMinimumHeight(150);
    connect(client_, &im::Client::outboxChanged, this, &OutboxPanel::updateDepth);
    connect(client_, &im::Client::heldDraftsChanged, this, &OutboxPanel::updateDepth);
    updateDepth();
}

void OutboxPanel::updateDepth() {
    const int n = client_->pendingCount();
    const int held = client_->heldCount();
    depth_->setText(held > 0 ? tr("Queue depth: <b>%1</b> (held: <b>%2</b>)").arg(n).arg(held)
                             : tr("Queue depth: <b>%1</b>").arg(n));
    heldBox_->setVisible(held > 0);
}

void OutboxPanel::tick() {
    if (outbox_->depth() > 0) {
        table_->refreshColumn(ONextRetry);
        heldTable_->refreshColumn(ONextRetry);
    }
}
