# The aquad package's /etc/aqua/aquad.yaml: deploy/aquad.yaml with the sockets given to the aqua
# group its postinst creates, and that group admitted, so that an engine's user needs only to join
# it (usermod -aG aqua USER).
/^# What to edit first:/i\
# As installed by the aquad package: the sockets belong to the aqua group, which may connect;\
# add engine users to it (usermod -aG aqua USER). The rest of this paragraph is for other installs.\
#
s/^#socket-mode: 0660$/socket-mode: 0660/
s/^#socket-group: aqua$/socket-group: aqua/
/^#allow:$/,/^#  groups: \[aqua\]$/{
s/^#allow:$/allow:/
/^#  users: /d
s/^#  groups: \[aqua\]$/  groups: [aqua]/
}
