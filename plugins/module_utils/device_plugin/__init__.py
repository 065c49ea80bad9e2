# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
#
# Private support code of the kubegpu.node.nvidia_device_plugin module. Nothing in this package is a public
# interface: names and signatures change without notice between releases.
